// The alpha and beta kernels of steps 1 to 3 of chapter 4, written once (step 1: plain pointers, step 2:
// __restrict__, step 3: LDG). Layouts and conventions: ctc_step01_baseline.cu.
#pragma once

#include "ctc_common.cuh"   // NEG_INF, log_plus, row_max
#include "ctc_warpctc.cuh"  // read<LDG> and the pieces of steps 1 to 6 that no step changes

// The alpha recursion: one block per utterance, thread i owning positions i, i + blockDim.x, ...; each previous
// row is read back from the alpha matrix in global memory, and the labels are read again at every frame. The
// alpha matrix stays a plain load: this kernel writes it.
template <bool LDG>
__device__ __forceinline__ void alpha_baseline(
    const float* log_probs, const int* labels, const int* input_lengths, const int* target_lengths,
    float* alphas, double* log_likelihood, int T, int N, int A, int Lmax) {
    const auto [n, Tn, S, Smax, warp, lane, nwarps] = utterance<LDG>(input_lengths, target_lengths, Lmax);
    __shared__ float warp_maxima[2][32];
    float* a = alphas + (size_t)n * T * Smax;
    double shift = 0.0;       // log alpha_t(s) = a[t][s] + shift
    float prev_max = 0.0f;    // maximum of row t - 1, subtracted while reading it
    for (int t = 0; t < Tn; ++t) {
        if (t > 0) {
            prev_max = row_max(warp_maxima[(t - 1) & 1], nwarps);
            shift += prev_max;
        }
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        const float* prev = a + (size_t)(t > 0 ? t - 1 : 0) * Smax;
        float local_max = NEG_INF;
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const int label = (s & 1) ? read<LDG>(labels, n * Lmax, s >> 1) : 0;
            float v;
            if (t == 0) {
                v = (s <= 1) ? 0.0f : NEG_INF;
            } else {
                v = prev[s] - prev_max;
                if (s >= 1) v = log_plus(v, prev[s - 1] - prev_max);
                if ((s & 1) && s >= 3 && label != read<LDG>(labels, n * Lmax, s >> 1, -1))
                    v = log_plus(v, prev[s - 2] - prev_max);
            }
            v += read<LDG>(lp, label);
            a[(size_t)t * Smax + s] = v;
            local_max = fmaxf(local_max, v);
        }
        publish_row_max(local_max, warp_maxima[t & 1], warp, lane);
        __syncthreads();
    }
    if (threadIdx.x == 0) log_likelihood[n] = log_likelihood_of(a + (size_t)(Tn - 1) * Smax, S, shift);
}

// Beta recursion (two live rows in shared memory) and the gradient of frame t:
// grad[t][n][k] = softmax_k - (sum over positions s with label k of alpha_t(s) beta_t(s) / y_t(k)) / P,
// where P = the same sum over all positions (the likelihood, up to the rows' offsets).
template <bool LDG>
__device__ __forceinline__ void beta_grad_baseline(
    const float* log_probs, const int* labels, const int* input_lengths, const int* target_lengths,
    const int* slot_class, const int* slot_start, const int* slot_members, const int* num_slots,
    const float* alphas, const double* log_likelihood, float* grad, float* loss,
    int T, int N, int A, int Lmax, int Umax, int zero_infinity) {
    extern __shared__ float smem[];  // beta rows [2][Smax], then the posterior of each position [Smax]
    __shared__ float warp_maxima[2][32];
    __shared__ float warp_top[32], warp_total[32], warp_blank[32];
    const int n = blockIdx.x;
    const int Tn = read<LDG>(input_lengths, n);
    const int S = 2 * read<LDG>(target_lengths, n) + 1;
    const int Smax = 2 * Lmax + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    float* post = smem + 2 * Smax;
    if (no_alignment(read<LDG>(log_likelihood, n), loss, grad, zero_infinity, Tn, T, n, N, A)) return;
    const float* a = alphas + (size_t)n * T * Smax;
    const int U = read<LDG>(num_slots, n);
    float next_max = 0.0f;    // maximum of row t + 1, subtracted while reading it
    for (int t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) next_max = row_max(warp_maxima[(t + 1) & 1], nwarps);
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        float* g = grad + ((size_t)t * N + n) * A;
        float* cur = smem + (t & 1) * Smax;
        const float* nxt = smem + ((t + 1) & 1) * Smax;
        float local_max = NEG_INF, top = NEG_INF;
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const int label = (s & 1) ? read<LDG>(labels, n * Lmax, s >> 1) : 0;
            const float e = read<LDG>(lp, label);
            float v;
            if (t == Tn - 1) {
                v = (s >= S - 2) ? 0.0f : NEG_INF;
            } else {
                v = nxt[s] - next_max;
                if (s + 1 < S) v = log_plus(v, nxt[s + 1] - next_max);
                if ((s & 1) && s + 2 < S && label != read<LDG>(labels, n * Lmax, s >> 1, 1))
                    v = log_plus(v, nxt[s + 2] - next_max);
            }
            v += e;
            cur[s] = v;
            local_max = fmaxf(local_max, v);
            post[s] = read<LDG>(a, (size_t)t * Smax, s) + v - e;  // log of alpha beta / y, up to the offsets
            top = fmaxf(top, post[s]);
        }
        top = frame_top(local_max, top, warp_maxima[t & 1], warp_top);
        float total = 0.0f, blank = 0.0f;
        for (int s = threadIdx.x; s < S; s += blockDim.x) normalise_posterior(post, s, top, total, blank);
        frame_gradient<LDG>(g, lp, post, total, blank, warp_total, warp_blank, slot_class, slot_start, slot_members, n,
                            U, Umax, Lmax, A, warp, lane, nwarps);
    }
}
