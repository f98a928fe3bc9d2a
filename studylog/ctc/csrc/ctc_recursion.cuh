// One direction of the recursion of steps 7, 8 and 10 of chapter 4: what those steps share around the update
// of a frame. A lane (step 10: a thread) holds V consecutive positions of the extended target in registers.
#pragma once

#include "ctc_common.cuh"  // NEG_INF

// The emissions lane `lane` (step 10: thread) needs of one frame (e: the frame's Lmax + 1 emissions): the
// blank's, and those of its H labels lane H + 1 .. lane H + H (-inf past the target's L labels).
template <int H>
__device__ __forceinline__ void frame_emissions(const float* e, int lane, int L, float& eb, float (&el)[H]) {
    eb = __ldg(e);
#pragma unroll
    for (int q = 0; q < H; ++q) {
        const int j = lane * H + q + 1;
        el[q] = j <= L ? __ldg(e + j) : NEG_INF;
    }
}

// The largest of a lane's V values.
template <int V>
__device__ __forceinline__ float lane_max(const float (&r)[V]) {
    float local = r[0];
#pragma unroll
    for (int i = 1; i < V; ++i) local = fmaxf(local, r[i]);
    return local;
}

// A lane's V values of a row, written two at a time (8-byte stores: V is even and dst_row 8-byte aligned).
template <int V>
__device__ __forceinline__ void store_row(float* dst_row, const float (&r)[V]) {
    float2* dst = reinterpret_cast<float2*>(dst_row);
#pragma unroll
    for (int i = 0; i < V; i += 2) dst[i >> 1] = make_float2(r[i], r[i + 1]);
}
