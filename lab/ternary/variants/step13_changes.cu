// Step 13 (studylog/ternary/csrc/ternary_w2a8.cu, step13_w2a8_tiles_kernel) frozen, with the one change it
// bundles beside its idea (warps that own tiles of rows over a slice of K) as a compile-time knob
// (lab/ternary/step13_changes.py launches it):
//   X_TMA  true: step 13's x, the block's rows of the slice brought by the copy engine, one bulk copy a row
//          issued by a second producer thread (lane 1) once quantize_x is done, completed on x_full;
//          false: step 12's x at several rows (QUANT_SEPARATE), the consumer warps load the slice themselves
//          (load_xq_slice: plain loads from L2, 4 in flight a thread, each block from its own unit on), then
//          meet at the consumers' barrier. Both put the same bytes in the same places of shared memory, so the
//          arithmetic and its order, and the output, are the same bit for bit.
// With X_TMA = true the kernel body is step13_w2a8_tiles_kernel's, line for line, and compiles to the library's
// SASS (step13_changes.py check --compile-only compares them, the kernels' names aside).
// The library's file is included whole for its device functions (group_w2a8, load_xq_slice, w2a8_sum, w2a8_z,
// the ring); its kernels are templates, instantiated only where named.
#include "ternary_w2a8.cu"

template <int MT, int WARPS, int TILES, int STAGES, int CHUNK, bool X_TMA>
__global__ void __launch_bounds__(32 * (WARPS + 1), 1) step13_changes_kernel(
    const uint4 *__restrict__ xq, const uint4 *__restrict__ w, float *__restrict__ z, const float *__restrict__ scale,
    const float *__restrict__ x_scale, const int *__restrict__ row_sum, int *__restrict__ partials,
    u32 *__restrict__ arrivals, int M, int N, int groups, int scale_stride, int groups_per_slice) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.z * 8 * MT, x_rows = min(8 * MT, M - m0);
    // tiles blockIdx.x WARPS TILES .. + WARPS TILES - 1, CHUNK groups of each a stage
    const WeightRing<WARPS * TILES, STAGES, CHUNK> ring(smem, w, 1, N, groups, groups_per_slice);
    uint4 *xs = ring.after();
    const int chunks = ring.chunks(), xs_stride = groups_per_slice * 16 + 4;
    u64 *x_full = ring.spare_barriers();  // x's rows are in shared memory
    if (threadIdx.x == 0) {
        ring.init(WARPS);  // a stage is free once every consumer warp has its tile's groups
        mbarrier_init(x_full, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == WARPS) {
        if (lane == 0) {  // the weights (they need nothing from quantize_x), every chunk as soon as its stage is free
            const u64 policy = evict_first_policy();
            for (int c = 0; c < chunks; ++c) ring.fill(c, policy);
        } else if (X_TMA && lane == 1) {  // x's rows of the slice, once quantize_x has written them
            asm volatile("griddepcontrol.wait;" ::: "memory");
            const u32 bytes = (u32)(ring.g_end - ring.g_begin) * 256u;
            mbarrier_expect_bytes(x_full, bytes * x_rows);
            const u64 policy = evict_last_policy();  // every block of the slice reads it
            for (int r = 0; r < x_rows; ++r)
                bulk_copy(xs + r * xs_stride, xq + ((size_t)(m0 + r) * groups + ring.g_begin) * 16, bytes, x_full,
                          policy);
        }
        __syncwarp();
    } else {
        asm volatile("griddepcontrol.wait;" ::: "memory");  // quantize_x's x_scale and row_sum (the epilogue)
        if constexpr (X_TMA) {
            mbarrier_wait(x_full, 0);
        } else {  // step 12's loads (QUANT_SEPARATE): the consumers bring the block's slice of x themselves
            const int rot = (blockIdx.x % (ring.g_end - ring.g_begin)) * 16;
            load_xq_slice(xs, xq, m0, x_rows, groups, ring.g_begin, ring.g_end, xs_stride, rot, threadIdx.x,
                          WARPS * 32);
            consumer_barrier(WARPS);
        }
        int acc[4][TILES][MT][4] = {};
        for (int c = 0; c < chunks; ++c) {
            uint4 a[CHUNK][TILES][2];
            const int gl = ring.group(c, 0) - ring.g_begin, ng = ring.take_tiles(c, warp * TILES, lane, a);
#pragma unroll
            for (int cg = 0; cg < CHUNK; ++cg)
                if (cg < ng) {
                    uint4 xv[MT][4];
#pragma unroll
                    for (int j = 0; j < MT; ++j)
#pragma unroll
                        for (int p = 0; p < 4; ++p)
                            xv[j][p] = xs[min(8 * j + g, x_rows - 1) * xs_stride + (gl + cg) * 16 + 4 * p + t];
                    group_w2a8<MT, TILES>(acc, a[cg], xv);
                }
        }
        // the warp's tiles: rows n of W (C fragment rows g, g + 8), columns m of x (2 t, 2 t + 1 of each 8)
#pragma unroll
        for (int i = 0; i < TILES; ++i)
#pragma unroll
            for (int j = 0; j < MT; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int n = (ring.tile0 + warp * TILES + i) * 16 + 8 * (c >> 1) + g;
                    const int m = m0 + 8 * j + 2 * t + (c & 1);
                    if (n >= N || m >= M) continue;
                    const int sum = w2a8_sum(acc[0][i][j][c], acc[1][i][j][c], acc[2][i][j][c], acc[3][i][j][c]);
                    if (gridDim.y > 1)
                        partials[((size_t)blockIdx.y * M + m) * N + n] = sum;
                    else
                        z[(size_t)m * N + n] =
                            w2a8_z(sum, __ldcg(&row_sum[m]), __ldcg(&x_scale[m]), scale[(size_t)n * scale_stride]);
                }
    }
    if (gridDim.y > 1) {
        asm volatile("griddepcontrol.wait;" ::: "memory");  // the producer's threads may store too
        finish_split_with(arrivals, blockIdx.z * gridDim.x + blockIdx.x, gridDim.y, partials, M, N,
                          ring.tile0 * 16, 16 * WARPS * TILES, m0, x_rows, [&](int m, int n, int sum) {
                              z[(size_t)m * N + n] =
                                  w2a8_z(sum, __ldcg(&row_sum[m]), __ldcg(&x_scale[m]), scale[(size_t)n * scale_stride]);
                          });
    }
}
