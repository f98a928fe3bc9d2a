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

// The posterior of label slot u >= 1 of utterance n (slots: studylog.ctc.prepare_targets): post summed over
// the positions of its label's occurrences, position 2 m - 1 for the m-th label (1-based) of the target. LDG:
// the slot arrays are read through __ldg (the end of the slot once); without it, as plain loads.
template <bool LDG = true>
__device__ __forceinline__ float slot_posterior(const float* post, const int* slot_start, const int* slot_members,
                                                int n, int u, int Umax, int Lmax) {
    float sum = 0.0f;
    if constexpr (LDG) {
        const int end = __ldg(slot_start + n * (Umax + 1) + u + 1);
        for (int m = __ldg(slot_start + n * (Umax + 1) + u); m < end; ++m)
            sum += post[2 * __ldg(slot_members + n * Lmax + m) - 1];
    } else {
        for (int m = slot_start[n * (Umax + 1) + u]; m < slot_start[n * (Umax + 1) + u + 1]; ++m)
            sum += post[2 * slot_members[n * Lmax + m] - 1];
    }
    return sum;
}
