// CTC loss and gradient, step 7 of chapter 4: the softmax is never written out.
//   ctc_fused_stats      a block per frame (t, n): the frame's log-sum-exp and the base-2 log-probabilities of
//                        the blank and the target's labels ("emissions", (N, T, Lmax + 1), entry 0 = blank).
//   ctc_fused_recursion  a warp per utterance and direction, alpha and beta at the same time
//                        (ctc_warp_recursion.cuh); rows (2, N, T, 32 V), offsets row_shift (2, N, T), double.
//   ctc_fused_grad       a block per frame (t, n): the posterior from the two rows, normalised over the frame,
//                        then grad = softmax - posterior from the activations and the frame's log-sum-exp.
// Traffic in T N A floats: activations read twice, gradient written once, against four for steps 1 to 6.

#include "ctc_common.cuh"          // NEG_INF, FULL_MASK, slot_posterior
#include "ctc_fused.cuh"           // frame_lse, write_emissions, frame_posterior, loss_of_frame, write_softmax
#include "ctc_warp_recursion.cuh"  // warp_recursion: the recursion on a warp per direction, but its update

// Pass 1: log-sum-exp of each frame and the emissions of the target's labels.
extern "C" __global__ void ctc_fused_stats(
    const float* __restrict__ x, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ row_lse, float* __restrict__ emissions,
    int T, int N, int A, int Lmax, int vectorised) {
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    if (t >= __ldg(input_lengths + n)) return;  // the whole block: this frame is past the input
    const float* xr = x + (size_t)row * A;
    const float lse = frame_lse(xr, A, vectorised, scratch);  // vectorised: A % 4 == 0 and x 16-byte aligned
    if (threadIdx.x == 0) row_lse[row] = lse;
    const int L = __ldg(target_lengths + n);
    float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
    write_emissions(em, xr, labels, n, Lmax, L, lse);
}

// Pass 2: the recursions. Base-2 log space: log2(2^a + 2^b [+ 2^c]).
__device__ __forceinline__ float lse2(float a, float b) {
    const float m = fmaxf(a, b);
    const float r = m + __log2f(1.0f + exp2f(fminf(a, b) - m));
    return m == NEG_INF ? NEG_INF : r;
}

__device__ __forceinline__ float lse3(float a, float b, float c) {
    const float hi = fmaxf(a, b), lo = fminf(a, b);
    const float m = fmaxf(hi, c), mid = fminf(hi, c);
    const float r = m + __log2f(1.0f + exp2f(mid - m) + exp2f(lo - m));
    return m == NEG_INF ? NEG_INF : r;
}

// Frames prefetched ahead of the one being computed (hides the load latency of the emissions).
#define PREFETCH 4

// The update of a frame: the lane's V positions from the old row r (prev_max: its maximum, subtracted), the
// neighbours across lanes from shuffles. eb, el: the frame's blank and the lane's H = V / 2 label emissions.
// warp_recursion (ctc_warp_recursion.cuh) runs it for every frame of each direction.
struct FrameUpdate {
    template <int V, bool BACKWARD>
    static __device__ __forceinline__ void frame(float (&r)[V], float eb, const float (&el)[V / 2], unsigned valid,
                                                 unsigned skip, float prev_max, int lane) {
        if (!BACKWARD) {
            float up1 = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
            float up2 = __shfl_up_sync(FULL_MASK, r[V - 2], 1);
            if (lane == 0) {
                up1 = NEG_INF;
                up2 = NEG_INF;
            }
#pragma unroll
            for (int i = V - 1; i >= 0; --i) {  // downwards: r[i - 1], r[i - 2] are still old
                const float x1 = i >= 1 ? r[i - 1] : up1;
                const float x2 = i >= 2 ? r[i - 2] : (i == 1 ? up1 : up2);
                float e = (i & 1) ? el[i >> 1] : eb;
                e = (valid >> i) & 1 ? e : NEG_INF;
                const float v = (i & 1) && ((skip >> i) & 1) ? lse3(r[i], x1, x2) : lse2(r[i], x1);
                r[i] = v + e - prev_max;
            }
        } else {
            float dn1 = __shfl_down_sync(FULL_MASK, r[0], 1);
            float dn2 = __shfl_down_sync(FULL_MASK, r[1], 1);
            if (lane == 31) {
                dn1 = NEG_INF;
                dn2 = NEG_INF;
            }
#pragma unroll
            for (int i = 0; i < V; ++i) {  // upwards: r[i + 1], r[i + 2] are still old
                const float x1 = i + 1 < V ? r[i + 1] : dn1;
                const float x2 = i + 2 < V ? r[i + 2] : (i + 2 == V ? dn1 : dn2);
                float e = (i & 1) ? el[i >> 1] : eb;
                e = (valid >> i) & 1 ? e : NEG_INF;
                const float v = (i & 1) && ((skip >> i) & 1) ? lse3(r[i], x1, x2) : lse2(r[i], x1);
                r[i] = v + e - prev_max;
            }
        }
    }
};

// grid (N, 2), block 32: alpha's warp and beta's side by side (warp_recursion).
template <int V>
__global__ void __launch_bounds__(32) ctc_fused_recursion(RECURSION_PARAMS) {
    warp_recursion<FrameUpdate, V, PREFETCH, false>(RECURSION_ARGS);
}

// Pass 3: posterior of frame t and grad = softmax - posterior, straight from the activations.
extern "C" __global__ void ctc_fused_grad(
    const float* __restrict__ x, const float* __restrict__ row_lse, const float* __restrict__ emissions,
    const float* __restrict__ rows, const double* __restrict__ row_shift, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, const int* __restrict__ slot_class, const int* __restrict__ slot_start,
    const int* __restrict__ slot_members, const int* __restrict__ num_slots, float* __restrict__ grad,
    float* __restrict__ loss, int T, int N, int A, int Lmax, int Umax, int row_stride, int vectorised,
    int zero_infinity) {
    __shared__ float post[1024];  // posterior of each position of this frame (S <= 1023)
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    float* g = grad + (size_t)row * A;
    const float* xr = x + (size_t)row * A;
    if (t >= __ldg(input_lengths + n)) {  // past the input: no gradient (the whole block)
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = 0.0f;
        return;
    }
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const float* ra = rows + ((size_t)n * T + t) * row_stride;
    const float* rb = rows + ((size_t)(N + n) * T + t) * row_stride;
    const float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);

    float top;  // log2 of the frame's largest alpha beta / y, up to the rows' offsets
    const float2 sums = frame_posterior(post, scratch, ra, rb, em, S, top);
    const bool infinite = top == NEG_INF;  // no alignment passes through this frame: P = 0
    if (t == 0 && threadIdx.x == 0) loss[n] = loss_of_frame(top, sums.x, row_shift, t, n, T, N, zero_infinity);
    if (infinite) {  // no alignment: the gradient is undefined (NaN), or zero with zero_infinity
        const float fill = zero_infinity ? 0.0f : __int_as_float(0x7fc00000);
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = fill;
        return;
    }
    const float inv_total = 1.0f / sums.x;
    const float lse = __ldg(row_lse + row);
    write_softmax(g, xr, A, vectorised, lse);
    __syncthreads();  // the softmax is written before the target's classes are overwritten
    const int U = __ldg(num_slots + n);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = __ldg(slot_class + n * Umax + u);
        const float p = u == 0 ? sums.y : slot_posterior(post, slot_start, slot_members, n, u, Umax, Lmax);
        g[cls] = __expf(__ldg(xr + cls) - lse) - p * inv_total;
    }
}
