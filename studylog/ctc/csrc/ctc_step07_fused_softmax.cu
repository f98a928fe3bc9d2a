// CTC loss and gradient, step 7 of chapter 4: the softmax is never written out.
//
//   ctc_fused_stats      one block per frame (t, n): log-sum-exp of the A activations, then the
//                        base-2 log-probabilities of the blank and of the target's labels
//                        ("emissions", (N, T, Lmax + 1), entry 0 = blank, j = label j).
//   ctc_fused_recursion  one warp per utterance and direction, alpha and beta at the same time:
//                        a lane holds V consecutive positions in registers, the neighbours
//                        across lanes come from shuffles, the emissions are prefetched a few
//                        frames ahead. Every row is written out (rows (2, N, T, 32 V)) with its
//                        base-2 offset (row_shift (2, N, T), double).
//   ctc_fused_grad       one block per frame (t, n): the posterior of each position from the
//                        two rows, normalised over the frame, then grad = softmax - posterior,
//                        computed from the activations and the frame's log-sum-exp.
//
// Traffic in arrays of T N A floats: the activations are read twice and the gradient written
// once (three passes), against four for steps 1 to 6 (activations read, log-probabilities
// written and read back, gradient written); the emission and row arrays are small.

#include "ctc_common.cuh"     // NEG_INF, FULL_MASK, warp_max, slot_posterior
#include "ctc_fused.cuh"      // frame_lse, write_emissions, frame_posterior, loss_of_frame, write_softmax
#include "ctc_recursion.cuh"  // frame_emissions, lane_max, store_row

// ------------------------------------------------------------------------------------------
// Pass 1: log-sum-exp of each frame and the emissions of the target's labels.
// ------------------------------------------------------------------------------------------
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

// ------------------------------------------------------------------------------------------
// Pass 2: the recursions. Base-2 log space: log2(2^a + 2^b [+ 2^c]).
// ------------------------------------------------------------------------------------------
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

// One direction for one utterance. Lane l owns positions s = l V .. l V + V - 1 (V even, so
// position i of a lane is a blank for even i and label j = l V / 2 + (i + 1) / 2 for odd i).
template <int V, bool BACKWARD>
__device__ __forceinline__ void ctc_recursion_direction(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    constexpr int H = V / 2;  // labels per lane
    const int n = blockIdx.x, lane = threadIdx.x;
    const int Tn = __ldg(input_lengths + n);
    const int L = __ldg(target_lengths + n);
    const int S = 2 * L + 1;
    const int s0 = lane * V;
    const int* lab = labels + n * Lmax;

    unsigned valid = 0, skip = 0;  // bit i: position s0 + i exists / takes the s -/+ 2 transition
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const int s = s0 + i;
        if (s < S) valid |= 1u << i;
        if ((i & 1) && s < S) {
            const int j = (s + 1) >> 1;  // 1-based label position; its label is lab[j - 1]
            const bool jump = BACKWARD ? (j + 1 <= L && __ldg(lab + j) != __ldg(lab + j - 1))
                                       : (j >= 2 && __ldg(lab + j - 1) != __ldg(lab + j - 2));
            if (jump) skip |= 1u << i;
        }
    }

    // The row before the first frame (alpha) or after the last (beta) holds one path of
    // probability 1: at s = 0 for alpha, at s = S - 1 for beta. Every frame is then one update.
    float r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = (s0 + i == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;

    const size_t stride = 32 * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float eb[PREFETCH];       // blank emission of the frame in each prefetch slot
    float el[PREFETCH][H];    // the lane's label emissions
#pragma unroll
    for (int p = 0; p < PREFETCH; ++p) {
        const int t = BACKWARD ? Tn - 1 - p : p;
        eb[p] = NEG_INF;
#pragma unroll
        for (int q = 0; q < H; ++q) el[p][q] = NEG_INF;
        if (p < Tn) {
            frame_emissions<H>(em_base + (size_t)t * (Lmax + 1), lane, L, eb[p], el[p]);
        }
    }

    double shift = 0.0;  // log2 alpha (or beta) of frame t = r + shift
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH) {
#pragma unroll
        for (int p = 0; p < PREFETCH; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole warp
                const int t = BACKWARD ? Tn - 1 - k : k;
                // the old row's maximum is reduced alongside the update and subtracted after it
                float prev_max = warp_max(lane_max<V>(r));
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
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
                        float e = (i & 1) ? el[p][i >> 1] : eb[p];
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
                        float e = (i & 1) ? el[p][i >> 1] : eb[p];
                        e = (valid >> i) & 1 ? e : NEG_INF;
                        const float v = (i & 1) && ((skip >> i) & 1) ? lse3(r[i], x1, x2) : lse2(r[i], x1);
                        r[i] = v + e - prev_max;
                    }
                }
                shift += prev_max;
                if (s0 < S) store_row<V>(out_rows + (size_t)t * stride, r);
                if (lane == 0) out_shift[t] = shift;
                // refill this slot with the frame PREFETCH steps ahead
                const int kn = k + PREFETCH;
                if (kn < Tn) {
                    frame_emissions<H>(em_base + (size_t)(BACKWARD ? Tn - 1 - kn : kn) * (Lmax + 1), lane, L, eb[p],
                                       el[p]);
                }
            }
        }
    }
}

// grid (N, 2), block 32: blockIdx.y = 0 runs alpha forward in time, 1 runs beta backward.
template <int V>
__global__ void __launch_bounds__(32) ctc_fused_recursion(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    if (blockIdx.y == 0)
        ctc_recursion_direction<V, false>(emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N,
                                          Lmax);
    else
        ctc_recursion_direction<V, true>(emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N,
                                         Lmax);
}

// ------------------------------------------------------------------------------------------
// Pass 3: posterior of frame t and grad = softmax - posterior, straight from the activations.
// ------------------------------------------------------------------------------------------
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
