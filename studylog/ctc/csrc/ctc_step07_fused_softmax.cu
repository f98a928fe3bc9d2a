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

#include "ctc_common.cuh"  // NEG_INF, FULL_MASK, warp_max, warp_sum
#include "ctc_fused.cuh"    // LOG2E, LN2, block_lse, block_max, block_sum2, online_lse

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
    float m = NEG_INF, s = 0.0f;
    if (vectorised) {  // A % 4 == 0 and x 16-byte aligned: every row starts 16-byte aligned
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int k = threadIdx.x; k < (A >> 2); k += blockDim.x) {
            const float4 v = __ldg(x4 + k);
            online_lse(m, s, v.x);
            online_lse(m, s, v.y);
            online_lse(m, s, v.z);
            online_lse(m, s, v.w);
        }
    } else {
        for (int k = threadIdx.x; k < A; k += blockDim.x) online_lse(m, s, __ldg(xr + k));
    }
    const float lse = block_lse(m, s, scratch);
    if (threadIdx.x == 0) row_lse[row] = lse;
    const int L = __ldg(target_lengths + n);
    float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
    for (int j = threadIdx.x; j <= L; j += blockDim.x) {
        const int cls = j == 0 ? 0 : __ldg(labels + n * Lmax + j - 1);
        em[j] = (__ldg(xr + cls) - lse) * LOG2E;
    }
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
            const float* e = em_base + (size_t)t * (Lmax + 1);
            eb[p] = __ldg(e);
#pragma unroll
            for (int q = 0; q < H; ++q) {
                const int j = lane * H + q + 1;
                el[p][q] = j <= L ? __ldg(e + j) : NEG_INF;
            }
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
                float local = r[0];
#pragma unroll
                for (int i = 1; i < V; ++i) local = fmaxf(local, r[i]);
                float prev_max = warp_max(local);
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
                if (s0 < S) {
                    float2* dst = reinterpret_cast<float2*>(out_rows + (size_t)t * stride);
#pragma unroll
                    for (int i = 0; i < V; i += 2) dst[i >> 1] = make_float2(r[i], r[i + 1]);
                }
                if (lane == 0) out_shift[t] = shift;
                // refill this slot with the frame PREFETCH steps ahead
                const int kn = k + PREFETCH;
                if (kn < Tn) {
                    const float* e = em_base + (size_t)(BACKWARD ? Tn - 1 - kn : kn) * (Lmax + 1);
                    eb[p] = __ldg(e);
#pragma unroll
                    for (int q = 0; q < H; ++q) {
                        const int j = lane * H + q + 1;
                        el[p][q] = j <= L ? __ldg(e + j) : NEG_INF;
                    }
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

    // log2 of alpha_t(s) beta_t(s) / y_t(s), up to the frame's two offsets
    float local = NEG_INF;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const float v = __ldg(ra + s) + __ldg(rb + s) - __ldg(em + ((s & 1) ? (s + 1) >> 1 : 0));
        post[s] = v;
        local = fmaxf(local, v);
    }
    const float top = block_max(local, scratch);  // also orders the writes to post
    const bool infinite = top == NEG_INF;         // no alignment passes through this frame: P = 0
    float total = 0.0f, blank = 0.0f;
    if (!infinite) {
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const float p = exp2f(post[s] - top);
            post[s] = p;
            total += p;
            if (!(s & 1)) blank += p;
        }
    }
    const float2 sums = block_sum2(total, blank, scratch);  // orders the writes to post again
    if (t == 0 && threadIdx.x == 0) {
        const double log2_p = (double)top + log2((double)sums.x) + __ldg(row_shift + (size_t)n * T + t) +
                              __ldg(row_shift + (size_t)(N + n) * T + t);
        loss[n] = infinite ? (zero_infinity ? 0.0f : __int_as_float(0x7f800000)) : (float)(-log2_p * LN2);
    }
    if (infinite) {  // no alignment: the gradient is undefined (NaN), or zero with zero_infinity
        const float fill = zero_infinity ? 0.0f : __int_as_float(0x7fc00000);
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = fill;
        return;
    }
    const float inv_total = 1.0f / sums.x;
    const float lse = __ldg(row_lse + row);
    if (vectorised) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* g4 = reinterpret_cast<float4*>(g);
        for (int k = threadIdx.x; k < (A >> 2); k += blockDim.x) {
            const float4 v = __ldg(x4 + k);
            g4[k] = make_float4(__expf(v.x - lse), __expf(v.y - lse), __expf(v.z - lse), __expf(v.w - lse));
        }
    } else {
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = __expf(__ldg(xr + k) - lse);
    }
    __syncthreads();  // the softmax is written before the target's classes are overwritten
    const int U = __ldg(num_slots + n);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = __ldg(slot_class + n * Umax + u);
        float p = 0.0f;
        if (u == 0) {
            p = sums.y;
        } else {
            const int end = __ldg(slot_start + n * (Umax + 1) + u + 1);
            for (int m = __ldg(slot_start + n * (Umax + 1) + u); m < end; ++m)
                p += post[2 * __ldg(slot_members + n * Lmax + m) - 1];
        }
        g[cls] = __expf(__ldg(xr + cls) - lse) - p * inv_total;
    }
}
