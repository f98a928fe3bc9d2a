// The latency floor of chapter 4's recursion: its chain of dependent frames and nothing else
// (studylog/ctc/floor.py launches it).
//
// Every frame of alpha (or beta) needs the whole previous frame at s, s - 1 and s - 2, so frames cannot
// overlap. This kernel is one frame's update, laid out as the final steps lay it out: CHAIN_V positions per
// thread in registers, the left neighbour by a warp shuffle and, past one warp, the warps' boundary values
// through shared memory with one barrier per frame; each position takes step 12's branch-free log-sum-exp and
// adds a per-state constant (standing in for the emission, so nothing can be hoisted out of the loop).
// Left out, so the time is a lower bound: the emissions, the passes around the recursion, the rows' stores,
// the per-frame maximum, the skip and validity selects and the -inf guard (all values stay finite).

#include "ctc_common.cuh"       // NEG_INF, FULL_MASK
#include "ctc_branch_free.cuh"  // ex2_ftz, lg2_ftz

#define CHAIN_V 4            // positions per thread (even: a thread starts on a blank)
#define CHAIN_MAX_WARPS 32   // one block of at most 1024 threads: at most 32 x 32 x 4 = 4096 positions

// The constant added at position s every frame (base-2 log units, as the recursion's emissions);
// tests/test_ctc_floor.py checks the output with the same formula.
__device__ __forceinline__ float chain_constant(int s) { return -1.25f - 0.0625f * (float)(s & 7); }

__device__ __forceinline__ float chain_lse2(float a, float b) {
    const float m = fmaxf(a, b);
    return m + lg2_ftz(1.0f + ex2_ftz(fminf(a, b) - m));
}

__device__ __forceinline__ float chain_lse3(float a, float b, float c) {
    const float hi = fmaxf(a, b), lo = fminf(a, b);
    const float m = fmaxf(hi, c), mid = fminf(hi, c);
    return m + lg2_ftz(1.0f + ex2_ftz(mid - m) + ex2_ftz(lo - m));
}

// The frames of one block (out: as ctc_chain_floor). ACROSS_WARPS: more than one warp, so the warps'
// boundary values go through shared memory and every frame ends at a barrier.
template <bool ACROSS_WARPS>
__device__ __forceinline__ void chain_frames(float* __restrict__ out, int frames, int states) {
    __shared__ float boundary[2][CHAIN_MAX_WARPS];  // [frame parity][warp]: the warp's last position
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int s0 = tid * CHAIN_V;

    float r[CHAIN_V], c[CHAIN_V];
#pragma unroll
    for (int i = 0; i < CHAIN_V; ++i) {
        r[i] = 0.0f;
        c[i] = chain_constant(s0 + i);
    }
    if (ACROSS_WARPS) {
        if (lane == 31) boundary[0][warp] = r[CHAIN_V - 1];
        __syncthreads();
    }

#pragma unroll 4
    for (int k = 0; k < frames; ++k) {
        const float from_left = __shfl_up_sync(FULL_MASK, r[CHAIN_V - 1], 1);
        const float across = (ACROSS_WARPS && warp > 0) ? boundary[k & 1][warp - 1] : NEG_INF;
        const float up1 = lane == 0 ? across : from_left;  // position s0 - 1 of the old frame
#pragma unroll
        for (int i = CHAIN_V - 1; i >= 0; --i) {  // downwards: r[i - 1], r[i - 2] are still old
            const float x1 = i >= 1 ? r[i - 1] : up1;
            if (i & 1) {  // a label: three terms (known at compile time)
                const float x2 = i >= 2 ? r[i - 2] : up1;
                r[i] = chain_lse3(r[i], x1, x2) + c[i];
            } else {  // a blank: two terms
                r[i] = chain_lse2(r[i], x1) + c[i];
            }
        }
        if (ACROSS_WARPS) {
            if (lane == 31) boundary[(k & 1) ^ 1][warp] = r[CHAIN_V - 1];
            __syncthreads();
        }
    }

#pragma unroll
    for (int i = 0; i < CHAIN_V; ++i)
        if (s0 + i < states) out[s0 + i] = r[i];
}

// grid (1), block 32 W (W = ceil(states / 128) warps, at most CHAIN_MAX_WARPS). out[s] for s < states: the
// values after `frames` frames from all zeros. One warp (step 12's form) exchanges by shuffles only; the
// choice is made once, outside the frame loop.
extern "C" __global__ void __launch_bounds__(32 * CHAIN_MAX_WARPS) ctc_chain_floor(
    float* __restrict__ out, int frames, int states) {
    if (blockDim.x > 32)
        chain_frames<true>(out, frames, states);
    else
        chain_frames<false>(out, frames, states);
}
