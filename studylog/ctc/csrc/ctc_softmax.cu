// CTC loss, chapter 4: the softmax kernels of steps 1 to 6 (one warp per row of A activations):
// log-probabilities for the log-space steps, probabilities for step 6.
// Layouts: ctc_step01_baseline.cu.

#include "ctc_common.cuh"  // NEG_INF, FULL_MASK, log_plus, warp_max, warp_sum, row_max

template <bool LOG>
__device__ __forceinline__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, int rows, int A) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;  // the whole warp leaves together; no block barrier below
    const float* xr = x + (size_t)row * A;
    float* out_row = out + (size_t)row * A;
    float m = NEG_INF;
    for (int k = lane; k < A; k += 32) m = fmaxf(m, xr[k]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int k = lane; k < A; k += 32) sum += expf(xr[k] - m);
    const float lse = m + logf(warp_sum(sum));
    for (int k = lane; k < A; k += 32) out_row[k] = LOG ? xr[k] - lse : expf(xr[k] - lse);
}

extern "C" __global__ void ctc_log_softmax_rows(const float* __restrict__ x, float* __restrict__ out, int rows, int A) {
    softmax_rows<true>(x, out, rows, A);
}

extern "C" __global__ void ctc_softmax_rows(const float* __restrict__ x, float* __restrict__ out, int rows, int A) {
    softmax_rows<false>(x, out, rows, A);
}
