// The positions of a thread in the register-blocked kernels of steps 4 to 6 of chapter 4
// (ctc_step04_05_blocked.cu, ctc_step06_probability.cu), and what it keeps of them in registers.
#pragma once

// Position of a thread's i-th entry: strided by the block, as in warp-ctc (s = threadIdx.x + i * blockDim.x), or,
// with BLOCKED, VT consecutive positions per thread.
template <int VT, bool BLOCKED>
__device__ __forceinline__ int position(int i) {
    return BLOCKED ? threadIdx.x * VT + i : threadIdx.x + i * blockDim.x;
}

// What a thread of steps 4 to 6 keeps in registers for the whole utterance n (S positions, labels read through
// __ldg): the label of each of its VT positions (0 for a blank or a position past S), and whether the position
// takes the skip transition, a label different from the one two positions away: reached from s - 2 (alpha), or,
// BACKWARD (beta), going on to s + 2. Both are gathered in locals and copied out last: written straight through the
// references, the flags compile to other instructions (a byte select in place of a predicate) at VT = 1.
template <int VT, bool BLOCKED, bool BACKWARD>
__device__ __forceinline__ void thread_labels(const int* labels, int n, int Lmax, int S, int (&label)[VT],
                                              bool (&skip)[VT]) {
    int labs[VT];
    bool skips[VT];
#pragma unroll
    for (int i = 0; i < VT; ++i) {
        const int s = position<VT, BLOCKED>(i);
        labs[i] = (s < S && (s & 1)) ? __ldg(labels + n * Lmax + (s >> 1)) : 0;
        if constexpr (BACKWARD)
            skips[i] = (s & 1) && s + 2 < S && labs[i] != __ldg(labels + n * Lmax + (s >> 1) + 1);
        else
            skips[i] = s < S && (s & 1) && s >= 3 && labs[i] != __ldg(labels + n * Lmax + (s >> 1) - 1);
    }
#pragma unroll
    for (int i = 0; i < VT; ++i) {
        label[i] = labs[i];
        skip[i] = skips[i];
    }
}
