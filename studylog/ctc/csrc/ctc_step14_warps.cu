// CTC loss, step 14 of chapter 4: the recursion over several warps per direction (step 13's two passes
// around it, ctc_step13_two_passes.cu).

#include "ctc_common.cuh"       // NEG_INF, FULL_MASK, warp_max
#include "ctc_branch_free.cuh"  // lse2_select, lse3_select
#include "ctc_recursion.cuh"    // RECURSION_PARAMS, lane_positions, prefetch_emissions, refill_emissions, lane_max,
                                // store_row

// One warp per direction leaves three of an SM's four schedulers idle and runs a long chain per frame (V
// positions per lane). Here a block of W warps shares the S positions, V = 2 or 4 per thread. Neighbouring
// warps exchange one or two boundary values per frame through shared memory, double-buffered so that one
// barrier per frame is enough; the same barrier combines the warps' maxima of the old row. The barrier waits
// on the update only: after it, every thread subtracts the block's maximum from its own values and from the
// boundary values it reads.
#define MAX_RECURSION_WARPS 16

template <int V, bool BACKWARD>
__device__ __forceinline__ void ctc_warps_direction(RECURSION_PARAMS) {
    constexpr int H = V / 2;  // labels per thread
    constexpr int PREFETCH_FRAMES = 4;
    // exchange[b][0][w]: warp w's maximum of the old row; exchange[b][1..2][w]: its boundary value(s)
    // of the new row before the block's maximum is subtracted. b alternates with the frame. The
    // maxima of all warps are contiguous: four 16-byte loads read them, unused slots hold -inf.
    __shared__ __align__(16) float exchange[2][3][MAX_RECURSION_WARPS];
    const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int Tn = __ldg(input_lengths + n);
    const int L = __ldg(target_lengths + n);
    const int S = 2 * L + 1;
    const int s0 = tid * V;

    unsigned valid, skip;  // bit i: position s0 + i exists / takes the s -/+ 2 transition
    float r[V];            // the thread's share of the row before the first frame (alpha) or after the last (beta)
    lane_positions<V, BACKWARD>(labels, n, Lmax, L, tid, valid, skip, r);

    const size_t stride = (size_t)blockDim.x * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float eb[PREFETCH_FRAMES];
    float el[PREFETCH_FRAMES][H];
    prefetch_emissions<H, PREFETCH_FRAMES, BACKWARD>(em_base, Tn, Lmax, tid, L, eb, el);

    // the row before the first frame: its boundary values, already in final form (offset 0)
    if (!BACKWARD && lane == 31) exchange[0][1][warp] = r[V - 1];
    if (BACKWARD && lane == 0) {
        exchange[0][1][warp] = r[0];
        exchange[0][2][warp] = r[1];
    }
    if (tid < 2 * MAX_RECURSION_WARPS && (tid % MAX_RECURSION_WARPS) >= warps)
        exchange[tid / MAX_RECURSION_WARPS][0][tid % MAX_RECURSION_WARPS] = NEG_INF;  // no such warp
    __syncthreads();

    float offset = 0.0f;  // what the boundary values in exchange[k & 1] still need subtracting
    double shift = 0.0;
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH_FRAMES) {
#pragma unroll
        for (int p = 0; p < PREFETCH_FRAMES; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole block
                const int t = BACKWARD ? Tn - 1 - k : k;
                const int b = k & 1;
                const float chunk_max = warp_max(lane_max<V>(r));  // this warp's share of the old row
                if (!BACKWARD) {
                    const float from_left = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
                    const float across = warp > 0 ? exchange[b][1][warp - 1] - offset : NEG_INF;
                    const float up1 = lane == 0 ? across : from_left;  // position s0 - 1
#pragma unroll
                    for (int i = V - 1; i >= 0; --i) {
                        const float x1 = i >= 1 ? r[i - 1] : up1;
                        if (i & 1) {
                            const float x2 = i >= 2 ? r[i - 2] : up1;
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<true>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e;
                        } else {
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<true>(r[i], x1) + e;
                        }
                    }
                    if (lane == 31) exchange[b ^ 1][1][warp] = r[V - 1];
                } else {
                    const float from_right1 = __shfl_down_sync(FULL_MASK, r[0], 1);
                    const float from_right2 = __shfl_down_sync(FULL_MASK, r[1], 1);
                    const bool last = warp == warps - 1;
                    const float across1 = last ? NEG_INF : exchange[b][1][warp + 1] - offset;
                    const float across2 = last ? NEG_INF : exchange[b][2][warp + 1] - offset;
                    const float dn1 = lane == 31 ? across1 : from_right1;  // position s0 + V
                    const float dn2 = lane == 31 ? across2 : from_right2;  // position s0 + V + 1
#pragma unroll
                    for (int i = 0; i < V; ++i) {
                        const float x1 = i + 1 < V ? r[i + 1] : dn1;
                        if (i & 1) {
                            const float x2 = i + 2 < V ? r[i + 2] : (i + 2 == V ? dn1 : dn2);
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<true>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e;
                        } else {
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<true>(r[i], x1) + e;
                        }
                    }
                    if (lane == 0) {
                        exchange[b ^ 1][1][warp] = r[0];
                        exchange[b ^ 1][2][warp] = r[1];
                    }
                }
                if (lane == 0) exchange[b ^ 1][0][warp] = chunk_max;
                __syncthreads();
                const float4* maxima = reinterpret_cast<const float4*>(exchange[b ^ 1][0]);
                float4 m4 = maxima[0];
#pragma unroll
                for (int q = 1; q < MAX_RECURSION_WARPS / 4; ++q) {
                    const float4 o = maxima[q];
                    m4 = make_float4(fmaxf(m4.x, o.x), fmaxf(m4.y, o.y), fmaxf(m4.z, o.z), fmaxf(m4.w, o.w));
                }
                float prev_max = fmaxf(fmaxf(m4.x, m4.y), fmaxf(m4.z, m4.w));  // the block's maximum of the old row
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
#pragma unroll
                for (int i = 0; i < V; ++i) r[i] -= prev_max;
                offset = prev_max;
                shift += prev_max;
                if (s0 < S) store_row<V>(out_rows + (size_t)t * stride, r);
                if (tid == 0) out_shift[t] = shift;
                refill_emissions<H, PREFETCH_FRAMES, BACKWARD>(em_base, k + PREFETCH_FRAMES, Tn, Lmax, tid, L, eb, el,
                                                               p);
            }
        }
    }
}

// grid (N, 2), block 32 W (W <= MAX_RECURSION_WARPS warps cover the S positions, V per thread).
template <int V>
__global__ void __launch_bounds__(32 * MAX_RECURSION_WARPS) ctc_warps_recursion(RECURSION_PARAMS) {
    if (blockIdx.y == 0)
        ctc_warps_direction<V, false>(RECURSION_ARGS);
    else
        ctc_warps_direction<V, true>(RECURSION_ARGS);
}
