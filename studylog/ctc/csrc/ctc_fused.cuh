// What the kernels of steps 7 to 14 of chapter 4 share: block-wide reductions, and the pieces of the first and
// last passes.
#pragma once

#include "ctc_common.cuh"  // NEG_INF, FULL_MASK, warp_max, warp_sum

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453

// Block-wide reductions (blockDim.x a multiple of 32, every thread calls them).
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

// Pieces of the first and last passes (steps 7 to 14): one block per frame (t, n).
// Log-sum-exp (natural log) of a frame's A activations xr: an online maximum and sum, with 16-byte loads
// when vectorised (A % 4 == 0 and xr 16-byte aligned).
__device__ __forceinline__ float frame_lse(const float* xr, int A, int vectorised, float* scratch) {
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
    return block_lse(m, s, scratch);
}

// out[k] = f(in[k]) for a frame's A values (16-byte loads and stores when vectorised: A % 4 == 0 and in, out
// 16-byte aligned).
template <class F>
__device__ __forceinline__ void map_frame(float* out, const float* in, int A, int vectorised, F f) {
    if (vectorised) {
        const float4* in4 = reinterpret_cast<const float4*>(in);
        float4* out4 = reinterpret_cast<float4*>(out);
        for (int k = threadIdx.x; k < (A >> 2); k += blockDim.x) {
            const float4 v = __ldg(in4 + k);
            out4[k] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
        }
    } else {
        for (int k = threadIdx.x; k < A; k += blockDim.x) out[k] = f(__ldg(in + k));
    }
}

// The softmax of a frame's A activations xr, given their log-sum-exp lse, written to g (map_frame).
__device__ __forceinline__ void write_softmax(float* g, const float* xr, int A, int vectorised, float lse) {
    map_frame(g, xr, A, vectorised, [lse](float x) { return __expf(x - lse); });
}

// The log-softmax x - lse of a frame's A activations xr, written to lp: step 7's first pass, what steps 1 to 6 write.
__device__ __forceinline__ void write_log_softmax(float* lp, const float* xr, int A, int vectorised, float lse) {
    map_frame(lp, xr, A, vectorised, [lse](float x) { return x - lse; });
}

// The softmax exp(lp) of a frame's log-softmax lp, written to g: step 7's last pass.
__device__ __forceinline__ void write_softmax_lp(float* g, const float* lp, int A, int vectorised) {
    map_frame(g, lp, A, vectorised, [](float x) { return __expf(x); });
}

// The emissions of a frame of utterance n: the base-2 log-probabilities of the blank (em[0]) and of the
// target's L labels (em[j], j = 1 .. L), from the frame's activations xr and their log-sum-exp lse.
__device__ __forceinline__ void write_emissions(float* em, const float* xr, const int* labels, int n, int Lmax, int L,
                                                float lse) {
    for (int j = threadIdx.x; j <= L; j += blockDim.x) {
        const int cls = j == 0 ? 0 : __ldg(labels + n * Lmax + j - 1);
        em[j] = (__ldg(xr + cls) - lse) * LOG2E;
    }
}

// The second half of frame_posterior: post[s] holds the log2 of position s's alpha beta / y and local this
// thread's largest of them; the block's largest goes to top, post[s] becomes the posterior relative to it, and the
// block's sums of post are returned (x: every position, y: the blanks). top is -inf when no alignment passes
// through the frame (P = 0): post then keeps its logs and the sums are 0.
__device__ __forceinline__ float2 posterior_sums(float* post, float* scratch, float local, int S, float& top) {
    top = block_max(local, scratch);  // also orders the writes to post
    float total = 0.0f, blank = 0.0f;
    if (top != NEG_INF) {
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const float p = exp2f(post[s] - top);
            post[s] = p;
            total += p;
            if (!(s & 1)) blank += p;
        }
    }
    return block_sum2(total, blank, scratch);  // orders the writes to post again
}

// The posterior of each position of a frame from its two rows (ra: alpha, rb: beta; base-2 log space, each
// relative to its row's offset) and its emissions em: post[s] = alpha beta / y relative to the frame's largest,
// whose log2 goes to top; returns the block's sums of post (posterior_sums).
__device__ __forceinline__ float2 frame_posterior(float* post, float* scratch, const float* ra, const float* rb,
                                                  const float* em, int S, float& top) {
    float local = NEG_INF;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const float v = __ldg(ra + s) + __ldg(rb + s) - __ldg(em + ((s & 1) ? (s + 1) >> 1 : 0));
        post[s] = v;
        local = fmaxf(local, v);
    }
    return posterior_sums(post, scratch, local, S, top);
}

// frame_posterior with the emissions read from the frame's log-softmax lp (step 7's last pass): the blank's for
// even s, label (s + 1) / 2's for odd s (lab: the utterance's labels), scaled to base 2 as the first pass of step 8
// scales them.
__device__ __forceinline__ float2 frame_posterior_lp(float* post, float* scratch, const float* ra, const float* rb,
                                                     const float* lp, const int* lab, int S, float& top) {
    float local = NEG_INF;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int cls = (s & 1) ? __ldg(lab + (s >> 1)) : 0;
        const float v = __ldg(ra + s) + __ldg(rb + s) - __fmul_rn(__ldg(lp + cls), LOG2E);
        post[s] = v;
        local = fmaxf(local, v);
    }
    return posterior_sums(post, scratch, local, S, top);
}

// The loss -ln P of utterance n from its frame t: top and total from frame_posterior, and the offsets of the
// frame's two rows (row_shift, (2, N, T)); +inf (0 with zero_infinity) when no alignment exists (top = -inf).
__device__ __forceinline__ float loss_of_frame(float top, float total, const double* row_shift, int t, int n, int T,
                                               int N, int zero_infinity) {
    const double log2_p = (double)top + log2((double)total) + __ldg(row_shift + (size_t)n * T + t) +
                          __ldg(row_shift + (size_t)(N + n) * T + t);
    return top == NEG_INF ? (zero_infinity ? 0.0f : __int_as_float(0x7f800000)) : (float)(-log2_p * LN2);
}

// A frame's A gradient entries g set to value (the whole block).
__device__ __forceinline__ void fill_frame(float* g, int A, float value) {
    for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = value;
}

// After frame_posterior in a last pass (steps 7 to 14): utterance n's loss from its frame 0 (thread 0), and where
// no alignment passes through the frame (top = -inf, P = 0) its gradient g filled: NaN, or zero with
// zero_infinity. Returns true then: the block has nothing left to do.
__device__ __forceinline__ bool no_alignment_in_frame(float* g, float* loss, float top, float total,
                                                      const double* row_shift, int t, int n, int T, int N, int A,
                                                      int zero_infinity) {
    const bool infinite = top == NEG_INF;
    if (t == 0 && threadIdx.x == 0) loss[n] = loss_of_frame(top, total, row_shift, t, n, T, N, zero_infinity);
    if (infinite) fill_frame(g, A, zero_infinity ? 0.0f : __int_as_float(0x7fc00000));
    return infinite;
}
