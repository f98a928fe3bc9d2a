// Step 8 of chapter 4 with its branch put back, so that step 8 minus that one change compiles
// (lab/ctc/step08_changes.py launches it between the library's first and last passes of step 7).
//
// Step 8 (studylog/ctc/csrc/ctc_step08_branch_free.cu, launched with the library's default options,
// studylog.ctc.fused.DEFAULT_RECURSION) changes two things in step 7's warp recursion:
//   1. no branch: a label position always takes the three-term log-sum-exp, its s -/+ 2 term set to
//      -inf where the skip is not allowed (lse3_select), instead of choosing between the two- and the
//      three-term form on the lane's skip bit (a divergent branch in step 7);
//   2. flush-to-zero: ex2.approx.ftz / lg2.approx.ftz instead of exp2f / __log2f (ctc_branch_free.cuh).
// Change 2 undone alone is a library option (recursion="branch-free"). Change 1 undone alone is this
// file: step 7's recursion (a copy of ctc_fused_recursion in ctc_step07_fused_softmax.cu, its branch
// included) with step 8's log-sum-exps, whose FTZ flag picks the flush-to-zero ex2/lg2 or not. With
// FTZ = false it is step 7's recursion; with FTZ = true it is step 8 with the branch, and since a
// three-term sum whose third term is -inf equals the two-term one (2^-inf is 0, exactly), it should
// compute what step 8 computes, bit for bit.

#include "ctc_common.cuh"       // NEG_INF, FULL_MASK, warp_max
#include "ctc_branch_free.cuh"  // lse2_select, lse3_select
#include "ctc_recursion.cuh"    // frame_emissions, lane_max, store_row

// Frames prefetched ahead of the one being computed, as in steps 7 and 8.
#define PREFETCH_FRAMES 4

// One direction for one utterance. Lane l owns positions s = l V .. l V + V - 1 (V even, so
// position i of a lane is a blank for even i and label j = l V / 2 + (i + 1) / 2 for odd i).
template <int V, bool FTZ, bool BACKWARD>
__device__ __forceinline__ void v8_branched_direction(
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

    // The row before the first frame (alpha) or after the last (beta) holds one path of
    // probability 1: at s = 0 for alpha, at s = S - 1 for beta. Every frame is then one update.
    float r[V];
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = (s0 + i == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;

    const size_t stride = 32 * V;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride + s0;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float eb[PREFETCH_FRAMES];       // blank emission of the frame in each prefetch slot
    float el[PREFETCH_FRAMES][H];    // the lane's label emissions
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

    double shift = 0.0;  // log2 alpha (or beta) of frame t = r + shift
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH_FRAMES) {
#pragma unroll
        for (int p = 0; p < PREFETCH_FRAMES; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole warp
                const int t = BACKWARD ? Tn - 1 - k : k;
                // the old row's maximum is reduced alongside the update and subtracted after it
                float prev_max = warp_max(lane_max<V>(r));
                prev_max = prev_max == NEG_INF ? 0.0f : prev_max;
                if (!BACKWARD) {
                    float up1 = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
                    float up2 = __shfl_up_sync(FULL_MASK, r[V - 2], 1);
                    if (lane == 0) {
                        up1 = NEG_INF;
                        up2 = NEG_INF;
                    }
#pragma unroll
                    for (int i = V - 1; i >= 0; --i) {  // downwards: r[i - 1], r[i - 2] are still old
                        const float x1 = i >= 1 ? r[i - 1] : up1;
                        const float x2 = i >= 2 ? r[i - 2] : (i == 1 ? up1 : up2);
                        float e = (i & 1) ? el[p][i >> 1] : eb[p];
                        e = (valid >> i) & 1 ? e : NEG_INF;
                        const float v = (i & 1) && ((skip >> i) & 1) ? lse3_select<FTZ>(r[i], x1, x2)
                                                                     : lse2_select<FTZ>(r[i], x1);
                        r[i] = v + e - prev_max;
                    }
                } else {
                    float dn1 = __shfl_down_sync(FULL_MASK, r[0], 1);
                    float dn2 = __shfl_down_sync(FULL_MASK, r[1], 1);
                    if (lane == 31) {
                        dn1 = NEG_INF;
                        dn2 = NEG_INF;
                    }
#pragma unroll
                    for (int i = 0; i < V; ++i) {  // upwards: r[i + 1], r[i + 2] are still old
                        const float x1 = i + 1 < V ? r[i + 1] : dn1;
                        const float x2 = i + 2 < V ? r[i + 2] : (i + 2 == V ? dn1 : dn2);
                        float e = (i & 1) ? el[p][i >> 1] : eb[p];
                        e = (valid >> i) & 1 ? e : NEG_INF;
                        const float v = (i & 1) && ((skip >> i) & 1) ? lse3_select<FTZ>(r[i], x1, x2)
                                                                     : lse2_select<FTZ>(r[i], x1);
                        r[i] = v + e - prev_max;
                    }
                }
                shift += prev_max;
                if (s0 < S) store_row<V>(out_rows + (size_t)t * stride, r);
                if (lane == 0) out_shift[t] = shift;
                // refill this slot with the frame PREFETCH_FRAMES steps ahead
                const int kn = k + PREFETCH_FRAMES;
                if (kn < Tn) {
                    frame_emissions<H>(em_base + (size_t)(BACKWARD ? Tn - 1 - kn : kn) * (Lmax + 1), lane, L, eb[p],
                                       el[p]);
                }
            }
        }
    }
}

// grid (N, 2), block 32: blockIdx.y = 0 runs alpha forward in time, 1 runs beta backward.
template <int V, bool FTZ>
__global__ void __launch_bounds__(32) v8_branched_recursion(
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift,
    int T, int N, int Lmax) {
    if (blockIdx.y == 0)
        v8_branched_direction<V, FTZ, false>(emissions, labels, input_lengths, target_lengths, rows, row_shift,
                                             T, N, Lmax);
    else
        v8_branched_direction<V, FTZ, true>(emissions, labels, input_lengths, target_lengths, rows, row_shift,
                                            T, N, Lmax);
}
