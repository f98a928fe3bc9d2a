// CTC loss, steps 11 and 12 of chapter 4: step 10's warp recursion without the divergent branch at every label
// position (step 11; why and how: ctc_branch_free.cuh), then with flush-to-zero ex2/lg2 (step 12, FTZ), between
// step 10's first and last passes.

#include "ctc_common.cuh"          // NEG_INF, FULL_MASK
#include "ctc_branch_free.cuh"     // lse2_select, lse3_select
#include "ctc_warp_recursion.cuh"  // warp_recursion: the recursion on a warp per direction, but its update

// The update of a frame, as step 10's but that a label always takes the three-term sum (its third term -inf where
// the skip is not allowed); FTZ: flush-to-zero ex2/lg2.
template <bool FTZ>
struct FrameUpdate {
    template <int V, bool BACKWARD>
    static __device__ __forceinline__ void frame(float (&r)[V], float eb, const float (&el)[V / 2], unsigned valid,
                                                 unsigned skip, float prev_max, int lane) {
        if (!BACKWARD) {
            const float from_left = __shfl_up_sync(FULL_MASK, r[V - 1], 1);
            const float up1 = lane == 0 ? NEG_INF : from_left;  // position s0 - 1
#pragma unroll
            for (int i = V - 1; i >= 0; --i) {  // downwards: r[i - 1], r[i - 2] are still old
                const float x1 = i >= 1 ? r[i - 1] : up1;
                if (i & 1) {  // a label (known at compile time): always three terms
                    const float x2 = i >= 2 ? r[i - 2] : up1;
                    const float e = (valid >> i) & 1 ? el[i >> 1] : NEG_INF;
                    r[i] = lse3_select<FTZ>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e - prev_max;
                } else {  // a blank
                    const float e = (valid >> i) & 1 ? eb : NEG_INF;
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
                    const float e = (valid >> i) & 1 ? el[i >> 1] : NEG_INF;
                    r[i] = lse3_select<FTZ>(r[i], x1, (skip >> i) & 1 ? x2 : NEG_INF) + e - prev_max;
                } else {
                    const float e = (valid >> i) & 1 ? eb : NEG_INF;
                    r[i] = lse2_select<FTZ>(r[i], x1) + e - prev_max;
                }
            }
        }
    }
};

// grid (N, 2), block 32, as step 10; FTZ (step 12), PREFETCH_FRAMES and REDUX: ctc_branch_free.cuh.
template <int V, int PREFETCH_FRAMES, bool FTZ, bool REDUX>
__global__ void __launch_bounds__(32) ctc_branchless_recursion(RECURSION_PARAMS) {
    warp_recursion<FrameUpdate<FTZ>, V, PREFETCH_FRAMES, REDUX>(RECURSION_ARGS);
}
