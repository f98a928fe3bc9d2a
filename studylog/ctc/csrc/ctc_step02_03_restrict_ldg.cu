// CTC loss and gradient, warp-ctc style: steps 2 and 3 of chapter 4, step 1 (ctc_step01_baseline.cu)
// with __restrict__ pointers, then with __ldg loads. Layouts and conventions: ctc_step01_baseline.cu.

#include "ctc_baseline.cuh"  // alpha_baseline, beta_grad_baseline: the kernels of steps 1 to 3

// Step 2 (LDG = false): every pointer __restrict__: the compiler may assume that the stores to alphas and grad
// never change what the other pointers point at. Step 3 (LDG = true): every load of read-only data through __ldg.
template <bool LDG>
__global__ void ctc_alpha_restrict(ALPHA_PARAMS(log_probs)) {
    alpha_baseline<LDG>(log_probs, labels, input_lengths, target_lengths, alphas, log_likelihood, T, N, A, Lmax);
}

template <bool LDG>
__global__ void ctc_beta_grad_restrict(BETA_POINTERS(log_probs), BETA_SIZES) {
    beta_grad_baseline<LDG>(log_probs, labels, input_lengths, target_lengths, slot_class, slot_start, slot_members,
                            num_slots, alphas, log_likelihood, grad, loss, T, N, A, Lmax, Umax, zero_infinity);
}
