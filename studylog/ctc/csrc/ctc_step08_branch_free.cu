// CTC loss, step 8 of chapter 4: step 7's warp recursion (ctc_step07_fused_softmax.cu) without the
// divergent branch at every label position; why and how: ctc_branch_free.cuh. Step 8 launches step 7's
// first and last passes around this recursion.

#include "ctc_common.cuh"       // NEG_INF, FULL_MASK
#include "ctc_branch_free.cuh"  // lse2_select, lse3_select, warp_max_of
#include "ctc_recursion.cuh"    // frame_emissions, lane_max, store_row

template <int V, int PREFETCH_FRAMES, bool FTZ, bool REDUX, bool BACKWARD>
__device__ __forceinline__ void ctc_branchless_direction(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    constexpr int H = V / 2;  // labels per lane
    const int n = blockIdx.x, lane = threadIdx.x;
    const int Tn = __ldg(input_lengths + n);
    const int L = __ldg(target_lengths + n);
    const int S = 2 * L + 1;
    const int s0 = lane * V;
    const int* lab = labels + n * Lmax;

    unsigned valid = 0, skip = 0;  // bit i: position s0 + i exists / takes the s -/+ 2 transition
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const int s = s0 + i;
        if (s < S) valid |= 1u << i;
        if ((i & 1) && s < S) {
            const int j = (s + 1) >> 1;  // 1-based label position; its label is lab[j - 1]
            const bool jump = BACKWARD ? (j + 1 <= L && __ldg(lab + j) != __ldg(lab + j - 1))
                                       : (j >= 2 && __ldg(lab + j - 1) != __ldg(lab + j - 2));
            if (jump) skip |= 1u << i;
        }
    }

    float r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = (s0 + i == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;

    const size_t stride = 32 * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float eb[PREFETCH_FRAMES];
    float el[PREFETCH_FRAMES][H];
#pragma unroll
    for (int p = 0; p < PREFETCH_FRAMES; ++p) {
        const int t = BACKWARD ? Tn - 1 - p : p;
        eb[p] = NEG_INF;
#pragma unroll
        for (int q = 0; q < H; ++q) el[p][q] = NEG_INF;
        if (p < Tn) {
            frame_emissions<H>(em_base + (size_t)t * (Lmax + 1), lane, L, eb[p], el[p]);
        }
    }

    double shift = 0.0;
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH_FRAMES) {
#pragma unroll
        for (int p = 0; p < PREFETCH_FRAMES; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole warp
                const int t = BACKWARD ? Tn - 1 - k : k;
                float prev_max = warp_max_of<REDUX>(lane_max<V>(r));
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
                if (!BACKWARD) {
                    const float from_left = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
                    const float up1 = lane == 0 ? NEG_INF : from_left;  // position s0 - 1
#pragma unroll
                    for (int i = V - 1; i >= 0; --i) {  // downwards: r[i - 1], r[i - 2] are still old
                        const float x1 = i >= 1 ? r[i - 1] : up1;
                        if (i & 1) {  // a label (known at compile time): always three terms
                            const float x2 = i >= 2 ? r[i - 2] : up1;
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<FTZ>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e - prev_max;
                        } else {  // a blank
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<FTZ>(r[i], x1) + e - prev_max;
                        }
                    }
                } else {
                    const float from_right1 = __shfl_down_sync(FULL_MASK, r[0], 1);
                    const float from_right2 = __shfl_down_sync(FULL_MASK, r[1], 1);
                    const float dn1 = lane == 31 ? NEG_INF : from_right1;  // position s0 + V
                    const float dn2 = lane == 31 ? NEG_INF : from_right2;  // position s0 + V + 1
#pragma unroll
                    for (int i = 0; i < V; ++i) {  // upwards: r[i + 1], r[i + 2] are still old
                        const float x1 = i + 1 < V ? r[i + 1] : dn1;
                        if (i & 1) {
                            const float x2 = i + 2 < V ? r[i + 2] : (i + 2 == V ? dn1 : dn2);
                            const float e = (valid >> i) & 1 ? el[p][i >> 1] : NEG_INF;
                            r[i] = lse3_select<FTZ>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e - prev_max;
                        } else {
                            const float e = (valid >> i) & 1 ? eb[p] : NEG_INF;
                            r[i] = lse2_select<FTZ>(r[i], x1) + e - prev_max;
                        }
                    }
                }
                shift += prev_max;
                if (s0 < S) store_row<V>(out_rows + (size_t)t * stride, r);
                if (lane == 0) out_shift[t] = shift;
                const int kn = k + PREFETCH_FRAMES;
                if (kn < Tn) {
                    frame_emissions<H>(em_base + (size_t)(BACKWARD ? Tn - 1 - kn : kn) * (Lmax + 1), lane, L, eb[p],
                                       el[p]);
                }
            }
        }
    }
}

// grid (N, 2), block 32, as step 7.
template <int V, int PREFETCH_FRAMES, bool FTZ, bool REDUX>
__global__ void __launch_bounds__(32) ctc_branchless_recursion(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    if (blockIdx.y == 0)
        ctc_branchless_direction<V, PREFETCH_FRAMES, FTZ, REDUX, false>(
            emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax);
    else
        ctc_branchless_direction<V, PREFETCH_FRAMES, FTZ, REDUX, true>(
            emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax);
}
