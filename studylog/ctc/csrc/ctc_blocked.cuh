// Position of a thread's i-th entry in the register-blocked kernels of steps 4 to 6 of chapter 4
// (ctc_step04_05_blocked.cu, ctc_step06_probability.cu): strided by the block, as in warp-ctc
// (s = threadIdx.x + i * blockDim.x), or, with BLOCKED, VT consecutive positions per thread.
#pragma once

template <int VT, bool BLOCKED>
__device__ __forceinline__ int position(int i) {
    return BLOCKED ? threadIdx.x * VT + i : threadIdx.x + i * blockDim.x;
}
