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

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453

// ------------------------------------------------------------------------------------------
// Block-wide reductions (blockDim.x a multiple of 32, every thread calls them).
// ------------------------------------------------------------------------------------------
// Combine two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == NEG_INF) return;  // both empty
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

// Log-sum-exp (natural log) of the values the block's threads summarised as (m, s).
__device__ float block_lse(float m, float s, float* scratch /* 64 floats */) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        const float s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        lse_merge(m, s, m2, s2);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        scratch[warp] = m;
        scratch[32 + warp] = s;
    }
    __syncthreads();
    m = NEG_INF;
    s = 0.0f;
    for (int w = 0; w < nwarps; ++w) lse_merge(m, s, scratch[w], scratch[32 + w]);
    __syncthreads();  // scratch may be reused
    return m == NEG_INF ? NEG_INF : m + __logf(s);
}

__device__ float block_max(float v, float* scratch) {
    v = warp_max(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = NEG_INF;
    for (int w = 0; w < nwarps; ++w) v = fmaxf(v, scratch[w]);
    __syncthreads();
    return v;
}

__device__ float2 block_sum2(float a, float b, float* scratch) {
    a = warp_sum(a);
    b = warp_sum(b);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        scratch[warp] = a;
        scratch[32 + warp] = b;
    }
    __syncthreads();
    a = 0.0f;
    b = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
        a += scratch[w];
        b += scratch[32 + w];
    }
    __syncthreads();
    return make_float2(a, b);
}

__device__ __forceinline__ void online_lse(float& m, float& s, float v) {
    if (v > m) {
        s = s * __expf(m - v) + 1.0f;
        m = v;
    } else if (v != NEG_INF) {
        s += __expf(v - m);
    }
}

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

// ==========================================================================================
// Step 8: the same recursion without a branch in the frame loop.
//
// In step 7 the choice between the two- and three-term log-sum-exp of a label position depends on
// the lane's skip bit, a run-time value that differs between lanes: the compiler turns each label
// position into a divergent branch (BSSY/BRA/BSYNC in the SASS), and the V positions of a lane,
// independent in principle, run one after another with every exp and log latency exposed. Here a
// label always takes the three-term form, with the s -/+ 2 term set to -inf where the skip is not
// allowed: the same value, and straight-line code the scheduler can interleave. Two smaller
// options, template flags so the benchmark can measure each:
//   FTZ    ex2/lg2 with flush-to-zero. exp2f guards subnormal inputs and results with a compare
//          and two multiplies around every ex2; a term 2^-126 below the largest one of its sum
//          changes nothing, so flushing it is exact to float32 here.
//   REDUX  the warp maximum as one redux.sync on an order-preserving integer image of the floats
//          instead of five rounds of shuffle and max.
// ==========================================================================================
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2_ftz(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <bool FTZ>
__device__ __forceinline__ float pow2(float x) {
    return FTZ ? ex2_ftz(x) : exp2f(x);
}

template <bool FTZ>
__device__ __forceinline__ float log2_of(float x) {
    return FTZ ? lg2_ftz(x) : __log2f(x);
}

template <bool FTZ>
__device__ __forceinline__ float lse2_select(float a, float b) {
    const float m = fmaxf(a, b);
    const float r = m + log2_of<FTZ>(1.0f + pow2<FTZ>(fminf(a, b) - m));
    return m == NEG_INF ? NEG_INF : r;
}

// log2(2^a + 2^b + 2^c); c = -inf (no skip) gives the two-term value, so no branch is needed
template <bool FTZ>
__device__ __forceinline__ float lse3_select(float a, float b, float c) {
    const float hi = fmaxf(a, b), lo = fminf(a, b);
    const float m = fmaxf(hi, c), mid = fminf(hi, c);
    const float r = m + log2_of<FTZ>(1.0f + pow2<FTZ>(mid - m) + pow2<FTZ>(lo - m));
    return m == NEG_INF ? NEG_INF : r;
}

// An integer image of a float that keeps the order of all non-NaN floats (negative floats have
// their magnitude bits flipped); the map is its own inverse.
__device__ __forceinline__ int ordered_bits(float f) {
    const int i = __float_as_int(f);
    return i >= 0 ? i : i ^ 0x7fffffff;
}

__device__ __forceinline__ float from_ordered_bits(int i) {
    return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff);
}

template <bool REDUX>
__device__ __forceinline__ float warp_max_of(float v) {
    if (REDUX) return from_ordered_bits(__reduce_max_sync(FULL_MASK, ordered_bits(v)));
    return warp_max(v);
}

template <int V, int PREFETCH_FRAMES, bool FTZ, bool REDUX, bool BACKWARD>
__device__ __forceinline__ void ctc_branchless_direction(
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

    float r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = (s0 + i == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;

    const size_t stride = 32 * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float eb[PREFETCH_FRAMES];
    float el[PREFETCH_FRAMES][H];
#pragma unroll
    for (int p = 0; p < PREFETCH_FRAMES; ++p) {
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

    double shift = 0.0;
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH_FRAMES) {
#pragma unroll
        for (int p = 0; p < PREFETCH_FRAMES; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole warp
                const int t = BACKWARD ? Tn - 1 - k : k;
                float local = r[0];
#pragma unroll
                for (int i = 1; i < V; ++i) local = fmaxf(local, r[i]);
                float prev_max = warp_max_of<REDUX>(local);
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
                if (!BACKWARD) {
                    const float from_left = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
                    const float up1 = lane == 0 ? NEG_INF : from_left;  // position s0 - 1
#pragma unroll
                    for (int i = V - 1; i >= 0; --i) {  // downwards: r[i - 1], r[i - 2] are still old
                        const float x1 = i >= 1 ? r[i - 1] : up1;
                        if (i & 1) {  // a label (known at compile time): always three terms
                            const float x2 = i >= 2 ? r[i - 2] : up1;
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<FTZ>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e - prev_max;
                        } else {  // a blank
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<FTZ>(r[i], x1) + e - prev_max;
                        }
                    }
                } else {
                    const float from_right1 = __shfl_down_sync(FULL_MASK, r[0], 1);
                    const float from_right2 = __shfl_down_sync(FULL_MASK, r[1], 1);
                    const float dn1 = lane == 31 ? NEG_INF : from_right1;  // position s0 + V
                    const float dn2 = lane == 31 ? NEG_INF : from_right2;  // position s0 + V + 1
#pragma unroll
                    for (int i = 0; i < V; ++i) {  // upwards: r[i + 1], r[i + 2] are still old
                        const float x1 = i + 1 < V ? r[i + 1] : dn1;
                        if (i & 1) {
                            const float x2 = i + 2 < V ? r[i + 2] : (i + 2 == V ? dn1 : dn2);
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<FTZ>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e - prev_max;
                        } else {
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<FTZ>(r[i], x1) + e - prev_max;
                        }
                    }
                }
                shift += prev_max;
                if (s0 < S) {
                    float2* dst = reinterpret_cast<float2*>(out_rows + (size_t)t * stride);
#pragma unroll
                    for (int i = 0; i < V; i += 2) dst[i >> 1] = make_float2(r[i], r[i + 1]);
                }
                if (lane == 0) out_shift[t] = shift;
                const int kn = k + PREFETCH_FRAMES;
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

// grid (N, 2), block 32, as step 7.
template <int V, int PREFETCH_FRAMES, bool FTZ, bool REDUX>
__global__ void __launch_bounds__(32) ctc_branchless_recursion(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    if (blockIdx.y == 0)
        ctc_branchless_direction<V, PREFETCH_FRAMES, FTZ, REDUX, false>(
            emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax);
    else
        ctc_branchless_direction<V, PREFETCH_FRAMES, FTZ, REDUX, true>(
            emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax);
}

// ==========================================================================================
// Step 9: two passes over the activations instead of three.
//
// Step 7's gradient pass reads every activation a second time from DRAM to write the softmax,
// although only the L + 1 classes of the target need the recursions. Here the first pass writes
// the softmax as the gradient while it still holds the frame (in registers: every load of the
// frame is issued before the first is used, then a maximum, a sum and the softmax), and the last
// pass only corrects the target's classes, softmax - posterior, in place. DRAM traffic: the
// activations once, the gradient once, plus a read and a write of L + 1 entries per frame.
// ==========================================================================================
// float4s per thread the first pass holds in registers: frames of A <= 4 * ROW_CHUNKS * blockDim
#define ROW_CHUNKS 8

extern "C" __global__ void ctc_stats_softmax(
    const float* __restrict__ x, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ row_lse, float* __restrict__ emissions,
    float* __restrict__ grad, int T, int N, int A, int Lmax, int vectorised) {
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    const float* xr = x + (size_t)row * A;
    float* g = grad + (size_t)row * A;
    if (t >= __ldg(input_lengths + n)) {  // past the input: no gradient (the whole block)
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = 0.0f;
        return;
    }
    const int L = __ldg(target_lengths + n);
    float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
    const int A4 = A >> 2;
    if (vectorised && A4 <= ROW_CHUNKS * (int)blockDim.x) {  // the frame fits the block's registers
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* g4 = reinterpret_cast<float4*>(g);
        float4 v[ROW_CHUNKS];
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c) {
            const int k = threadIdx.x + c * blockDim.x;
            v[c] = k < A4 ? __ldg(x4 + k) : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
        }
        float top = NEG_INF;
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c) top = fmaxf(top, fmaxf(fmaxf(v[c].x, v[c].y), fmaxf(v[c].z, v[c].w)));
        top = block_max(top, scratch);
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c)
            sum += __expf(v[c].x - top) + __expf(v[c].y - top) + __expf(v[c].z - top) + __expf(v[c].w - top);
        const float lse = top + __logf(block_sum2(sum, 0.0f, scratch).x);
        if (threadIdx.x == 0) row_lse[row] = lse;
        for (int j = threadIdx.x; j <= L; j += blockDim.x) {
            const int cls = j == 0 ? 0 : __ldg(labels + n * Lmax + j - 1);
            em[j] = (__ldg(xr + cls) - lse) * LOG2E;
        }
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c) {
            const int k = threadIdx.x + c * blockDim.x;
            if (k < A4)
                g4[k] = make_float4(__expf(v[c].x - lse), __expf(v[c].y - lse), __expf(v[c].z - lse),
                                    __expf(v[c].w - lse));
        }
        return;
    }
    // larger or unaligned frames: reduce, then read the frame again (the same thread, the same
    // addresses, moments later: mostly L1 hits)
    float m = NEG_INF, s = 0.0f;
    if (vectorised) {
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
    for (int j = threadIdx.x; j <= L; j += blockDim.x) {
        const int cls = j == 0 ? 0 : __ldg(labels + n * Lmax + j - 1);
        em[j] = (__ldg(xr + cls) - lse) * LOG2E;
    }
    if (vectorised) {  // each thread re-reads exactly the float4s it reduced above
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* g4 = reinterpret_cast<float4*>(g);
        for (int k = threadIdx.x; k < (A >> 2); k += blockDim.x) {
            const float4 v = __ldg(x4 + k);
            g4[k] = make_float4(__expf(v.x - lse), __expf(v.y - lse), __expf(v.z - lse), __expf(v.w - lse));
        }
    } else {
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = __expf(__ldg(xr + k) - lse);
    }
}

// Pass 3 of step 9: one block per frame (t, n); only the target's classes are corrected, in place:
// reading the softmax back makes each touched 32-byte sector whole in L2 before it is written
// (and, for an utterance without any alignment, the whole frame is filled). x and row_lse are
// left in the signature of step 7's pass for the diff; the softmax is no longer recomputed.
extern "C" __global__ void ctc_target_grad(
    const float* __restrict__ x, const float* __restrict__ row_lse, const float* __restrict__ emissions,
    const float* __restrict__ rows, const double* __restrict__ row_shift, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, const int* __restrict__ slot_class, const int* __restrict__ slot_start,
    const int* __restrict__ slot_members, const int* __restrict__ num_slots, float* __restrict__ grad,
    float* __restrict__ loss, int T, int N, int A, int Lmax, int Umax, int row_stride, int zero_infinity) {
    __shared__ float post[1024];  // posterior of each position of this frame (S <= 1023)
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    if (t >= __ldg(input_lengths + n)) return;  // the first pass wrote the zeros
    float* g = grad + (size_t)row * A;
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const float* ra = rows + ((size_t)n * T + t) * row_stride;
    const float* rb = rows + ((size_t)(N + n) * T + t) * row_stride;
    const float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);

    float local = NEG_INF;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const float v = __ldg(ra + s) + __ldg(rb + s) - __ldg(em + ((s & 1) ? (s + 1) >> 1 : 0));
        post[s] = v;
        local = fmaxf(local, v);
    }
    const float top = block_max(local, scratch);
    const bool infinite = top == NEG_INF;
    float total = 0.0f, blank = 0.0f;
    if (!infinite) {
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const float p = exp2f(post[s] - top);
            post[s] = p;
            total += p;
            if (!(s & 1)) blank += p;
        }
    }
    const float2 sums = block_sum2(total, blank, scratch);
    if (t == 0 && threadIdx.x == 0) {
        const double log2_p = (double)top + log2((double)sums.x) + __ldg(row_shift + (size_t)n * T + t) +
                              __ldg(row_shift + (size_t)(N + n) * T + t);
        loss[n] = infinite ? (zero_infinity ? 0.0f : __int_as_float(0x7f800000)) : (float)(-log2_p * LN2);
    }
    if (infinite) {  // no alignment: the whole frame is NaN, or zero with zero_infinity
        const float fill = zero_infinity ? 0.0f : __int_as_float(0x7fc00000);
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = fill;
        return;
    }
    const float inv_total = 1.0f / sums.x;
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
        g[cls] -= p * inv_total;  // the first pass wrote the softmax here
    }
}

// ==========================================================================================
// Step 10: several warps per utterance and direction.
//
// One warp per direction leaves three of an SM's four schedulers idle and runs every frame as
// about 28 instructions per position for V positions per lane: at V = 10 (S up to 320) a frame
// of step 8 still takes about half a microsecond on the H200. Here a block of W warps shares the S positions, V = 2 or 4
// per thread, so each scheduler runs a short chain. Neighbouring warps exchange one or two
// boundary values per frame through shared memory, double-buffered so that one barrier per frame
// is enough; the same barrier combines the warps' maxima of the old row, which each warp reduces
// while it computes the new one, as in steps 7 and 8. The new row is stored before subtracting
// that maximum, so the barrier waits on the update only: after it, every thread subtracts the
// block's maximum from its own values and from the boundary values it reads.
// ==========================================================================================
#define MAX_RECURSION_WARPS 16

template <int V, bool BACKWARD>
__device__ __forceinline__ void ctc_warps_direction(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    constexpr int H = V / 2;  // labels per thread
    constexpr int PREFETCH_FRAMES = 4;
    // exchange[b][0][w]: warp w's maximum of the old row; exchange[b][1..2][w]: its boundary value(s)
    // of the new row before the block's maximum is subtracted. b alternates with the frame. The
    // maxima of all warps are contiguous: four 16-byte loads read them, unused slots hold -inf.
    __shared__ __align__(16) float exchange[2][3][MAX_RECURSION_WARPS];
    const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int Tn = __ldg(input_lengths + n);
    const int L = __ldg(target_lengths + n);
    const int S = 2 * L + 1;
    const int s0 = tid * V;
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

    float r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = (s0 + i == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;

    const size_t stride = (size_t)blockDim.x * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float eb[PREFETCH_FRAMES];
    float el[PREFETCH_FRAMES][H];
#pragma unroll
    for (int p = 0; p < PREFETCH_FRAMES; ++p) {
        const int t = BACKWARD ? Tn - 1 - p : p;
        eb[p] = NEG_INF;
#pragma unroll
        for (int q = 0; q < H; ++q) el[p][q] = NEG_INF;
        if (p < Tn) {
            const float* e = em_base + (size_t)t * (Lmax + 1);
            eb[p] = __ldg(e);
#pragma unroll
            for (int q = 0; q < H; ++q) {
                const int j = tid * H + q + 1;
                el[p][q] = j <= L ? __ldg(e + j) : NEG_INF;
            }
        }
    }

    // the row before the first frame: its boundary values, already in final form (offset 0)
    if (!BACKWARD && lane == 31) exchange[0][1][warp] = r[V - 1];
    if (BACKWARD && lane == 0) {
        exchange[0][1][warp] = r[0];
        exchange[0][2][warp] = r[1];
    }
    if (tid < 2 * MAX_RECURSION_WARPS && (tid % MAX_RECURSION_WARPS) >= warps)
        exchange[tid / MAX_RECURSION_WARPS][0][tid % MAX_RECURSION_WARPS] = NEG_INF;  // no such warp
    __syncthreads();

    float offset = 0.0f;  // what the boundary values in exchange[k & 1] still need subtracting
    double shift = 0.0;
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH_FRAMES) {
#pragma unroll
        for (int p = 0; p < PREFETCH_FRAMES; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole block
                const int t = BACKWARD ? Tn - 1 - k : k;
                const int b = k & 1;
                float local = r[0];
#pragma unroll
                for (int i = 1; i < V; ++i) local = fmaxf(local, r[i]);
                const float chunk_max = warp_max(local);  // this warp's share of the old row
                if (!BACKWARD) {
                    const float from_left = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
                    const float across = warp > 0 ? exchange[b][1][warp - 1] - offset : NEG_INF;
                    const float up1 = lane == 0 ? across : from_left;  // position s0 - 1
#pragma unroll
                    for (int i = V - 1; i >= 0; --i) {
                        const float x1 = i >= 1 ? r[i - 1] : up1;
                        if (i & 1) {
                            const float x2 = i >= 2 ? r[i - 2] : up1;
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<true>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e;
                        } else {
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<true>(r[i], x1) + e;
                        }
                    }
                    if (lane == 31) exchange[b ^ 1][1][warp] = r[V - 1];
                } else {
                    const float from_right1 = __shfl_down_sync(FULL_MASK, r[0], 1);
                    const float from_right2 = __shfl_down_sync(FULL_MASK, r[1], 1);
                    const bool last = warp == warps - 1;
                    const float across1 = last ? NEG_INF : exchange[b][1][warp + 1] - offset;
                    const float across2 = last ? NEG_INF : exchange[b][2][warp + 1] - offset;
                    const float dn1 = lane == 31 ? across1 : from_right1;  // position s0 + V
                    const float dn2 = lane == 31 ? across2 : from_right2;  // position s0 + V + 1
#pragma unroll
                    for (int i = 0; i < V; ++i) {
                        const float x1 = i + 1 < V ? r[i + 1] : dn1;
                        if (i & 1) {
                            const float x2 = i + 2 < V ? r[i + 2] : (i + 2 == V ? dn1 : dn2);
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<true>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e;
                        } else {
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<true>(r[i], x1) + e;
                        }
                    }
                    if (lane == 0) {
                        exchange[b ^ 1][1][warp] = r[0];
                        exchange[b ^ 1][2][warp] = r[1];
                    }
                }
                if (lane == 0) exchange[b ^ 1][0][warp] = chunk_max;
                __syncthreads();
                const float4* maxima = reinterpret_cast<const float4*>(exchange[b ^ 1][0]);
                float4 m4 = maxima[0];
#pragma unroll
                for (int q = 1; q < MAX_RECURSION_WARPS / 4; ++q) {
                    const float4 o = maxima[q];
                    m4 = make_float4(fmaxf(m4.x, o.x), fmaxf(m4.y, o.y), fmaxf(m4.z, o.z), fmaxf(m4.w, o.w));
                }
                float prev_max = fmaxf(fmaxf(m4.x, m4.y), fmaxf(m4.z, m4.w));  // the block's maximum of the old row
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
#pragma unroll
                for (int i = 0; i < V; ++i) r[i] -= prev_max;
                offset = prev_max;
                shift += prev_max;
                if (s0 < S) {
                    float2* dst = reinterpret_cast<float2*>(out_rows + (size_t)t * stride);
#pragma unroll
                    for (int i = 0; i < V; i += 2) dst[i >> 1] = make_float2(r[i], r[i + 1]);
                }
                if (tid == 0) out_shift[t] = shift;
                const int kn = k + PREFETCH_FRAMES;
                if (kn < Tn) {
                    const float* e = em_base + (size_t)(BACKWARD ? Tn - 1 - kn : kn) * (Lmax + 1);
                    eb[p] = __ldg(e);
#pragma unroll
                    for (int q = 0; q < H; ++q) {
                        const int j = tid * H + q + 1;
                        el[p][q] = j <= L ? __ldg(e + j) : NEG_INF;
                    }
                }
            }
        }
    }
}

// grid (N, 2), block 32 W (W <= MAX_RECURSION_WARPS warps cover the S positions, V per thread).
template <int V>
__global__ void __launch_bounds__(32 * MAX_RECURSION_WARPS) ctc_warps_recursion(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    if (blockIdx.y == 0)
        ctc_warps_direction<V, false>(emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax);
    else
        ctc_warps_direction<V, true>(emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax);
}
