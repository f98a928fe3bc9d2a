// The branch-free log-sum-exp of steps 11 and 12 of chapter 4 and its options (also used by steps 13 and 14).
#pragma once

#include "ctc_common.cuh"  // NEG_INF, FULL_MASK, warp_max, warp_sum

// Step 10's choice between the two- and three-term log-sum-exp of a label depends on the lane's skip bit: a
// divergent branch per label position, which serialises a lane's V positions. Here (step 11) a label always
// takes the three-term form, its s -/+ 2 term -inf where the skip is not allowed: the same value, straight-line
// code. Two template flags:
//   FTZ    step 12: ex2/lg2 with flush-to-zero (no subnormal guards); a term 2^-126 below the largest of its
//          sum changes nothing, so flushing it is exact to float32 here.
//   REDUX  off by default (steps 12 and 13 take recursion="+ redux max"): the warp maximum as one redux.sync
//          on an order-preserving integer image of the floats.
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
