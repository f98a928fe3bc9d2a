// Helpers shared by the CTC kernels of chapter 4 (every ctc_*.cu in this folder).
#pragma once

#define NEG_INF __int_as_float(0xff800000)
#define NEG_INF_D __longlong_as_double((long long)0xfff0000000000000ULL)
#define FULL_MASK 0xffffffffu

// log(exp(a) + exp(b)), with -inf as the identity.
__device__ __forceinline__ float log_plus(float a, float b) {
    if (a == NEG_INF) return b;
    if (b == NEG_INF) return a;
    return fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// Maximum of the per-warp values written in the previous step; 0 when the row was all -inf.
__device__ __forceinline__ float row_max(const float* warp_values, int nwarps) {
    float m = NEG_INF;
    for (int w = 0; w < nwarps; ++w) m = fmaxf(m, warp_values[w]);
    return m == NEG_INF ? 0.0f : m;
}
