// Pieces of the alpha and beta kernels of steps 1 to 6 of chapter 4 that no step changes (layouts:
// ctc_step01_baseline.cu). Each takes the values its kernel already holds (warp, lane, ...).
#pragma once

#include "ctc_common.cuh"  // NEG_INF, NEG_INF_D, log_plus, warp_max, warp_sum, slot_posterior

// The arguments of the alpha and beta kernels of steps 2 to 6 (step 1's without __restrict__), in the order
// studylog.ctc.warpctc passes them: inputs first, then outputs (step 6's beta adds one before BETA_SIZES).
#define ALPHA_PARAMS(y)                                                                                   \
    const float* __restrict__ y, const int* __restrict__ labels, const int* __restrict__ input_lengths, \
        const int* __restrict__ target_lengths, float* __restrict__ alphas,                              \
        double* __restrict__ log_likelihood, int T, int N, int A, int Lmax
#define BETA_POINTERS(y)                                                                                      \
    const float* __restrict__ y, const int* __restrict__ labels, const int* __restrict__ input_lengths,     \
        const int* __restrict__ target_lengths, const int* __restrict__ slot_class,                          \
        const int* __restrict__ slot_start, const int* __restrict__ slot_members,                            \
        const int* __restrict__ num_slots, const float* __restrict__ alphas,                                 \
        const double* __restrict__ log_likelihood, float* __restrict__ grad, float* __restrict__ loss
#define BETA_SIZES int T, int N, int A, int Lmax, int Umax, int zero_infinity

// Element i + j + ... of p: a plain load (steps 1 and 2), or with LDG through the read-only data cache (step 3).
// With LDG the offsets are added to the pointer one by one, as a hand-written __ldg(p + i + j) does
// (p + (i + j) can compile to other instructions).
template <bool LDG, class T, class... I>
__device__ __forceinline__ T read(const T* p, I... i) {
    if constexpr (LDG) return __ldg((p + ... + i));
    else return p[(... + i)];
}

// What utterance<LDG> returns.
struct Utterance {
    int n, Tn, S, Smax, warp, lane, nwarps;
};

// What a block of steps 1 to 6 (one block per utterance) knows of its utterance n = blockIdx.x and of itself: the
// input length Tn, the S = 2 L + 1 positions of the extended target, the row length Smax = 2 Lmax + 1, and this
// thread's warp and lane of the block's nwarps. The lengths are read as read<LDG> reads.
template <bool LDG>
__device__ __forceinline__ Utterance utterance(const int* input_lengths, const int* target_lengths, int Lmax) {
    const int n = blockIdx.x;
    const int Tn = read<LDG>(input_lengths, n);
    const int S = 2 * read<LDG>(target_lengths, n) + 1;
    const int Smax = 2 * Lmax + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    return {n, Tn, S, Smax, warp, lane, nwarps};
}

// The rows of the recursions.
// Each warp's maximum of a row (this thread's share: local_max) goes to row_maxima, for the next frame.
__device__ __forceinline__ void publish_row_max(float local_max, float* row_maxima, int warp, int lane) {
    local_max = warp_max(local_max);
    if (lane == 0) row_maxima[warp] = local_max;
}

// log P from the last alpha row, stored relative to the offset shift: a path ends on the last label or on the
// blank after it.
__device__ __forceinline__ double log_likelihood_of(const float* last, int S, double shift) {
    float tail = last[S - 1];
    if (S > 1) tail = log_plus(tail, last[S - 2]);
    return (double)tail + shift;
}

// The gradient, frame by frame in the beta kernels.
// Frames t_begin .. t_end - 1 of utterance n's gradient set to value.
__device__ __forceinline__ void fill_frames(float* grad, float value, int t_begin, int t_end, int n, int N, int A) {
    for (int t = t_begin; t < t_end; ++t)
        for (int k = threadIdx.x; k < A; k += blockDim.x) grad[((size_t)t * N + n) * A + k] = value;
}

// Before a log-space beta kernel's recursion (steps 1 to 5): utterance n's loss (thread 0; 0 where it is infinite
// and zero_infinity), zeros in the gradient frames past the input length, and where no alignment exists
// (ll = -inf) every frame's gradient. Returns true then: the kernel has nothing left to do.
__device__ __forceinline__ bool no_alignment(double ll, float* loss, float* grad, int zero_infinity, int Tn, int T,
                                             int n, int N, int A) {
    const bool infinite = ll == NEG_INF_D;
    if (threadIdx.x == 0) loss[n] = (infinite && zero_infinity) ? 0.0f : (float)(-ll);
    fill_frames(grad, 0.0f, Tn, T, n, N, A);  // frames past the input length do not touch the loss
    if (infinite)  // no alignment: the gradient is undefined (NaN), or zero with zero_infinity
        fill_frames(grad, zero_infinity ? 0.0f : __int_as_float(0x7fc00000), 0, Tn, n, N, A);
    return infinite;
}

// After a frame's recursion: each warp's maximum of the new beta row (for the next frame, in row_maxima) and
// of the logs of the posteriors (top) go to shared memory; returns the block's maximum of the latter.
__device__ __forceinline__ float frame_top(float local_max, float top, float* row_maxima, float* warp_top) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    local_max = warp_max(local_max);
    top = warp_max(top);
    if (lane == 0) {
        row_maxima[warp] = local_max;
        warp_top[warp] = top;
    }
    __syncthreads();
    top = NEG_INF;
    for (int w = 0; w < nwarps; ++w) top = fmaxf(top, warp_top[w]);
    return top;
}

// Position s's posterior relative to the frame's largest (post[s] holds its log, top the block's largest log),
// added to this thread's sums over all positions (total) and over the blanks (blank).
__device__ __forceinline__ void normalise_posterior(float* post, int s, float top, float& total, float& blank) {
    const float p = expf(post[s] - top);
    post[s] = p;
    total += p;
    if (!(s & 1)) blank += p;
}

// This thread's sums of the frame's posteriors (total: all positions, blank: the blanks), summed over each warp
// into warp_total and warp_blank.
__device__ __forceinline__ void publish_posterior_sums(float total, float blank, float* warp_total, float* warp_blank,
                                                       int warp, int lane) {
    total = warp_sum(total);
    blank = warp_sum(blank);
    if (lane == 0) {
        warp_total[warp] = total;
        warp_blank[warp] = blank;
    }
}

// The sum of nwarps per-warp values.
__device__ __forceinline__ float sum_of_warps(const float* warp_values, int nwarps) {
    float sum = 0.0f;
    for (int w = 0; w < nwarps; ++w) sum += warp_values[w];
    return sum;
}

// The posterior of class slot u of utterance n in a frame, relative to the frame's largest: the blanks' (u = 0)
// from the per-warp sums warp_blank, a label's summed over its positions. LDG: the slot arrays are read through
// __ldg (steps 3 to 6).
template <bool LDG>
__device__ __forceinline__ float slot_sum(const float* post, const float* warp_blank, int nwarps, const int* slot_start,
                                          const int* slot_members, int n, int u, int Umax, int Lmax) {
    return u == 0 ? sum_of_warps(warp_blank, nwarps)
                  : slot_posterior<LDG>(post, slot_start, slot_members, n, u, Umax, Lmax);
}

// The end of a frame of the log-space beta kernels (steps 1 to 5), once post holds the frame's posteriors relative
// to the largest and this thread's sums of them (total: all positions, blank: the blanks): the softmax written over
// the frame's gradient g, then each class slot of the target corrected by its posterior over the frame's total.
// LDG: the log-probabilities and slot arrays are read through __ldg (steps 3 to 5).
template <bool LDG>
__device__ __forceinline__ void frame_gradient(float* g, const float* lp, const float* post, float total, float blank,
                                               float* warp_total, float* warp_blank, const int* slot_class,
                                               const int* slot_start, const int* slot_members, int n, int U, int Umax,
                                               int Lmax, int A, int warp, int lane, int nwarps) {
    publish_posterior_sums(total, blank, warp_total, warp_blank, warp, lane);
    for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = expf(read<LDG>(lp, k));
    __syncthreads();  // the softmax of the frame is written before the labels' entries are fixed
    const float inv_total = 1.0f / sum_of_warps(warp_total, nwarps);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = read<LDG>(slot_class, n * Umax, u);
        const float sum = slot_sum<LDG>(post, warp_blank, nwarps, slot_start, slot_members, n, u, Umax, Lmax);
        g[cls] = expf(read<LDG>(lp, cls)) - sum * inv_total;
    }
    __syncthreads();  // post and the per-warp sums are rewritten by the next frame
}
