// CTC loss and gradient, warp-ctc style: steps 2 and 3 of chapter 4, step 1 (ctc_step01_baseline.cu)
// with __restrict__ pointers, then with __ldg loads. Layouts and conventions: ctc_step01_baseline.cu.

#include "ctc_common.cuh"   // NEG_INF, NEG_INF_D, log_plus, row_max
#include "ctc_warpctc.cuh"  // the pieces of steps 1 to 6 that no step changes

// ==========================================================================================
// Step 2: the same kernels, with every pointer __restrict__: the compiler may assume that the
// stores to alphas and grad never change what the other pointers point at.
// ==========================================================================================
extern "C" __global__ void ctc_alpha_step2(
    const float* __restrict__ log_probs, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ alphas, double* __restrict__ log_likelihood, int T,
    int N, int A, int Lmax) {
    const int n = blockIdx.x;
    const int Tn = input_lengths[n];
    const int S = 2 * target_lengths[n] + 1;
    const int Smax = 2 * Lmax + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
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
            const int label = (s & 1) ? labels[n * Lmax + (s >> 1)] : 0;
            float v;
            if (t == 0) {
                v = (s <= 1) ? 0.0f : NEG_INF;
            } else {
                v = prev[s] - prev_max;
                if (s >= 1) v = log_plus(v, prev[s - 1] - prev_max);
                if ((s & 1) && s >= 3 && label != labels[n * Lmax + (s >> 1) - 1])
                    v = log_plus(v, prev[s - 2] - prev_max);
            }
            v += lp[label];
            a[(size_t)t * Smax + s] = v;
            local_max = fmaxf(local_max, v);
        }
        publish_row_max(local_max, warp_maxima[t & 1], warp, lane);
        __syncthreads();
    }
    if (threadIdx.x == 0) log_likelihood[n] = log_likelihood_of(a + (size_t)(Tn - 1) * Smax, S, shift);
}

extern "C" __global__ void ctc_beta_grad_step2(
    const float* __restrict__ log_probs, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, const int* __restrict__ slot_class, const int* __restrict__ slot_start,
    const int* __restrict__ slot_members, const int* __restrict__ num_slots, const float* __restrict__ alphas,
    const double* __restrict__ log_likelihood, float* __restrict__ grad, float* __restrict__ loss, int T, int N,
    int A, int Lmax, int Umax, int zero_infinity) {
    extern __shared__ float smem[];  // beta rows [2][Smax], then the posterior of each position [Smax]
    __shared__ float warp_maxima[2][32];
    __shared__ float warp_top[32], warp_total[32], warp_blank[32];
    const int n = blockIdx.x;
    const int Tn = input_lengths[n];
    const int S = 2 * target_lengths[n] + 1;
    const int Smax = 2 * Lmax + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    float* post = smem + 2 * Smax;
    if (no_alignment(log_likelihood[n], loss, grad, zero_infinity, Tn, T, n, N, A)) return;
    const float* a = alphas + (size_t)n * T * Smax;
    const int U = num_slots[n];
    float next_max = 0.0f;    // maximum of row t + 1, subtracted while reading it
    for (int t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) next_max = row_max(warp_maxima[(t + 1) & 1], nwarps);
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        float* g = grad + ((size_t)t * N + n) * A;
        float* cur = smem + (t & 1) * Smax;
        const float* nxt = smem + ((t + 1) & 1) * Smax;
        float local_max = NEG_INF, top = NEG_INF;
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const int label = (s & 1) ? labels[n * Lmax + (s >> 1)] : 0;
            const float e = lp[label];
            float v;
            if (t == Tn - 1) {
                v = (s >= S - 2) ? 0.0f : NEG_INF;
            } else {
                v = nxt[s] - next_max;
                if (s + 1 < S) v = log_plus(v, nxt[s + 1] - next_max);
                if ((s & 1) && s + 2 < S && label != labels[n * Lmax + (s >> 1) + 1])
                    v = log_plus(v, nxt[s + 2] - next_max);
            }
            v += e;
            cur[s] = v;
            local_max = fmaxf(local_max, v);
            post[s] = a[(size_t)t * Smax + s] + v - e;  // log of alpha beta / y, up to the offsets
            top = fmaxf(top, post[s]);
        }
        top = frame_top(local_max, top, warp_maxima[t & 1], warp_top);
        float total = 0.0f, blank = 0.0f;
        for (int s = threadIdx.x; s < S; s += blockDim.x) normalise_posterior(post, s, top, total, blank);
        publish_posterior_sums(total, blank, warp_total, warp_blank, warp, lane);
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = expf(lp[k]);
        __syncthreads();  // the softmax of the frame is written before the labels' entries are fixed
        const float inv_total = 1.0f / sum_of_warps(warp_total, nwarps);
        for (int u = threadIdx.x; u < U; u += blockDim.x) {
            const int cls = slot_class[n * Umax + u];
            const float sum = slot_sum<false>(post, warp_blank, nwarps, slot_start, slot_members, n, u, Umax, Lmax);
            g[cls] = expf(lp[cls]) - sum * inv_total;
        }
        __syncthreads();  // post and the per-warp sums are rewritten by the next frame
    }
}

// ==========================================================================================
// Step 3: step 2 with every load of read-only data through __ldg (the read-only data cache).
// The alpha matrix stays a plain load in the alpha kernel: that kernel writes it.
// ==========================================================================================
extern "C" __global__ void ctc_alpha_step3(
    const float* __restrict__ log_probs, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ alphas, double* __restrict__ log_likelihood, int T,
    int N, int A, int Lmax) {
    const int n = blockIdx.x;
    const int Tn = __ldg(input_lengths + n);
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const int Smax = 2 * Lmax + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
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
            const int label = (s & 1) ? __ldg(labels + n * Lmax + (s >> 1)) : 0;
            float v;
            if (t == 0) {
                v = (s <= 1) ? 0.0f : NEG_INF;
            } else {
                v = prev[s] - prev_max;
                if (s >= 1) v = log_plus(v, prev[s - 1] - prev_max);
                if ((s & 1) && s >= 3 && label != __ldg(labels + n * Lmax + (s >> 1) - 1))
                    v = log_plus(v, prev[s - 2] - prev_max);
            }
            v += __ldg(lp + label);
            a[(size_t)t * Smax + s] = v;
            local_max = fmaxf(local_max, v);
        }
        publish_row_max(local_max, warp_maxima[t & 1], warp, lane);
        __syncthreads();
    }
    if (threadIdx.x == 0) log_likelihood[n] = log_likelihood_of(a + (size_t)(Tn - 1) * Smax, S, shift);
}

extern "C" __global__ void ctc_beta_grad_step3(
    const float* __restrict__ log_probs, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, const int* __restrict__ slot_class, const int* __restrict__ slot_start,
    const int* __restrict__ slot_members, const int* __restrict__ num_slots, const float* __restrict__ alphas,
    const double* __restrict__ log_likelihood, float* __restrict__ grad, float* __restrict__ loss, int T, int N,
    int A, int Lmax, int Umax, int zero_infinity) {
    extern __shared__ float smem[];  // beta rows [2][Smax], then the posterior of each position [Smax]
    __shared__ float warp_maxima[2][32];
    __shared__ float warp_top[32], warp_total[32], warp_blank[32];
    const int n = blockIdx.x;
    const int Tn = __ldg(input_lengths + n);
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const int Smax = 2 * Lmax + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    float* post = smem + 2 * Smax;
    if (no_alignment(__ldg(log_likelihood + n), loss, grad, zero_infinity, Tn, T, n, N, A)) return;
    const float* a = alphas + (size_t)n * T * Smax;
    const int U = __ldg(num_slots + n);
    float next_max = 0.0f;    // maximum of row t + 1, subtracted while reading it
    for (int t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) next_max = row_max(warp_maxima[(t + 1) & 1], nwarps);
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        float* g = grad + ((size_t)t * N + n) * A;
        float* cur = smem + (t & 1) * Smax;
        const float* nxt = smem + ((t + 1) & 1) * Smax;
        float local_max = NEG_INF, top = NEG_INF;
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const int label = (s & 1) ? __ldg(labels + n * Lmax + (s >> 1)) : 0;
            const float e = __ldg(lp + label);
            float v;
            if (t == Tn - 1) {
                v = (s >= S - 2) ? 0.0f : NEG_INF;
            } else {
                v = nxt[s] - next_max;
                if (s + 1 < S) v = log_plus(v, nxt[s + 1] - next_max);
                if ((s & 1) && s + 2 < S && label != __ldg(labels + n * Lmax + (s >> 1) + 1))
                    v = log_plus(v, nxt[s + 2] - next_max);
            }
            v += e;
            cur[s] = v;
            local_max = fmaxf(local_max, v);
            post[s] = __ldg(a + (size_t)t * Smax + s) + v - e;  // log of alpha beta / y, up to the offsets
            top = fmaxf(top, post[s]);
        }
        top = frame_top(local_max, top, warp_maxima[t & 1], warp_top);
        float total = 0.0f, blank = 0.0f;
        for (int s = threadIdx.x; s < S; s += blockDim.x) normalise_posterior(post, s, top, total, blank);
        frame_gradient(g, lp, post, total, blank, warp_total, warp_blank, slot_class, slot_start, slot_members, n, U, Umax,
                       Lmax, A, warp, lane, nwarps);
    }
}
