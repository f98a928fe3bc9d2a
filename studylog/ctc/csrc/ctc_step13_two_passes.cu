// CTC loss, step 13 of chapter 4: two passes over the activations instead of three (step 12's recursion
// between them). Step 12's gradient pass reads every activation again to write the softmax, although only the
// target's L + 1 classes need the recursions. Here the first pass writes the softmax as the gradient while it
// holds the frame in registers, and the last pass only corrects the target's classes in place: the
// activations cross DRAM once, the gradient once, plus L + 1 entries per frame.

#include "ctc_common.cuh"  // NEG_INF, slot_posterior
#include "ctc_fused.cuh"   // LOG2E, block_max, block_sum2, frame_lse, write_emissions, write_softmax, ...

// float4s per thread the first pass holds in registers: frames of A <= 4 * ROW_CHUNKS * blockDim
#define ROW_CHUNKS 8

extern "C" __global__ void ctc_stats_softmax(
    const float* __restrict__ x, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ row_lse, float* __restrict__ emissions,
    float* __restrict__ grad, int T, int N, int A, int Lmax, int vectorised) {
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    const float* xr = x + (size_t)row * A;
    float* g = grad + (size_t)row * A;
    if (t >= __ldg(input_lengths + n)) {  // past the input: no gradient (the whole block)
        fill_frame(g, A, 0.0f);
        return;
    }
    const int L = __ldg(target_lengths + n);
    float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
    const int A4 = A >> 2;
    if (vectorised && A4 <= ROW_CHUNKS * (int)blockDim.x) {  // the frame fits the block's registers
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* g4 = reinterpret_cast<float4*>(g);
        float4 v[ROW_CHUNKS];
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c) {
            const int k = threadIdx.x + c * blockDim.x;
            v[c] = k < A4 ? __ldg(x4 + k) : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
        }
        float top = NEG_INF;
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c) top = fmaxf(top, fmaxf(fmaxf(v[c].x, v[c].y), fmaxf(v[c].z, v[c].w)));
        top = block_max(top, scratch);
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c)
            sum += __expf(v[c].x - top) + __expf(v[c].y - top) + __expf(v[c].z - top) + __expf(v[c].w - top);
        const float lse = top + __logf(block_sum2(sum, 0.0f, scratch).x);
        if (threadIdx.x == 0) row_lse[row] = lse;
        for (int j = threadIdx.x; j <= L; j += blockDim.x) {
            const int cls = j == 0 ? 0 : __ldg(labels + n * Lmax + j - 1);
            em[j] = (__ldg(xr + cls) - lse) * LOG2E;
        }
#pragma unroll
        for (int c = 0; c < ROW_CHUNKS; ++c) {
            const int k = threadIdx.x + c * blockDim.x;
            if (k < A4)
                g4[k] = make_float4(__expf(v[c].x - lse), __expf(v[c].y - lse), __expf(v[c].z - lse),
                                    __expf(v[c].w - lse));
        }
        return;
    }
    // larger or unaligned frames: reduce, then read the frame again (the same thread, the same
    // addresses, moments later: mostly L1 hits)
    const float lse = frame_lse(xr, A, vectorised, scratch);
    if (threadIdx.x == 0) row_lse[row] = lse;
    write_emissions(em, xr, labels, n, Lmax, L, lse);
    write_softmax(g, xr, A, vectorised, lse);  // each thread re-reads exactly the float4s it reduced above
}

// Pass 3 of step 13: one block per frame (t, n); only the target's classes are corrected, in place (the whole
// frame is filled for an utterance without any alignment). x and row_lse stay in the signature of step 12's
// pass for the diff.
extern "C" __global__ void ctc_target_grad(
    const float* __restrict__ x, const float* __restrict__ row_lse, const float* __restrict__ emissions,
    const float* __restrict__ rows, const double* __restrict__ row_shift, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, const int* __restrict__ slot_class, const int* __restrict__ slot_start,
    const int* __restrict__ slot_members, const int* __restrict__ num_slots, float* __restrict__ grad,
    float* __restrict__ loss, int T, int N, int A, int Lmax, int Umax, int row_stride, int zero_infinity) {
    __shared__ float post[1024];  // posterior of each position of this frame (S <= 1023)
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    if (t >= __ldg(input_lengths + n)) return;  // the first pass wrote the zeros
    float* g = grad + (size_t)row * A;
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const float* ra = rows + ((size_t)n * T + t) * row_stride;
    const float* rb = rows + ((size_t)(N + n) * T + t) * row_stride;
    const float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);

    float top;
    const float2 sums = frame_posterior(post, scratch, ra, rb, em, S, top);
    if (no_alignment_in_frame(g, loss, top, sums.x, row_shift, t, n, T, N, A, zero_infinity)) return;
    const float inv_total = 1.0f / sums.x;
    const int U = __ldg(num_slots + n);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = __ldg(slot_class + n * Umax + u);
        const float p = u == 0 ? sums.y : slot_posterior(post, slot_start, slot_members, n, u, Umax, Lmax);
        g[cls] -= p * inv_total;  // the first pass wrote the softmax here
    }
}
