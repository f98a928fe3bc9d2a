// Block-wide reductions and constants shared by the fused kernels of steps 7 to 10 of chapter 4.
#pragma once

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
