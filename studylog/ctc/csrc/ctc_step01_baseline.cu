// CTC loss and gradient, warp-ctc style: step 1 of chapter 4 (steps 2 and 3: ctc_step02_03_restrict_ldg.cu;
// the softmax kernels they launch first: ctc_softmax.cu).
//
// Layouts (all row-major, int32 indices from studylog.ctc.prepare_targets):
//   activations, log_probs, probs, grad : (T, N, A)       frame t of utterance n is row t * N + n
//   labels, slot_members                : (N, Lmax)       Lmax = label_stride (>= 1)
//   slot_class                          : (N, Umax)       slot 0 is the blank, slot u >= 1 a label
//   slot_start                          : (N, Umax + 1)   members of slot u: slot_start[u] .. [u + 1]
//   alphas                              : (N, T, Smax)    Smax = 2 Lmax + 1
//
// Position s of the extended target is the blank for even s and label (s + 1) / 2 (1-based) for
// odd s, stored at labels[n * Lmax + s / 2]. Every row is renormalised by the previous row's
// maximum, so the stored rows stay near 0 whatever T; the alpha kernel adds the maxima up (in
// double) for the loss. The posterior of frame t is normalised by its own sum over positions,
// which cancels the offsets of both rows: no offset needs to be stored.

#include "ctc_baseline.cuh"  // alpha_baseline, beta_grad_baseline: the kernels of steps 1 to 3

// Step 1: one block per utterance; the alpha kernel reads the previous row from the alpha matrix in global
// memory and re-reads labels every frame (ctc_baseline.cuh).
extern "C" __global__ void ctc_alpha_step1(
    const float* log_probs, const int* labels, const int* input_lengths, const int* target_lengths,
    float* alphas, double* log_likelihood, int T, int N, int A, int Lmax) {
    alpha_baseline<false>(log_probs, labels, input_lengths, target_lengths, alphas, log_likelihood, T, N, A, Lmax);
}

// The beta recursion and the gradient, frame by frame (ctc_baseline.cuh).
extern "C" __global__ void ctc_beta_grad_step1(
    const float* log_probs, const int* labels, const int* input_lengths, const int* target_lengths,
    const int* slot_class, const int* slot_start, const int* slot_members, const int* num_slots,
    const float* alphas, const double* log_likelihood, float* grad, float* loss,
    int T, int N, int A, int Lmax, int Umax, int zero_infinity) {
    beta_grad_baseline<false>(log_probs, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members,
                              num_slots, alphas, log_likelihood, grad, loss, T, N, A, Lmax, Umax, zero_infinity);
}
