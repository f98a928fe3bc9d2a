// Steps 15 to 17: step 14's decode and layout, written by hand on mma.sync (cuda_mma_kernel <<<(row blocks,
// K slices, M blocks), 32 x warps>>>), one template whose knob and launch are the three steps:
//   step 15 (X_SMEM = false, one slice of K): each thread loads its own A fragments with 16-byte loads, STAGES
//     groups of 256 weights ahead of the one it decodes (a ring of registers, no barrier in the loop); the
//     decode is a LOP3 and an HFMA2 per two weights, the products mma.sync m16n8k16 with float32 accumulators,
//     so the decode of the next step overlaps the MMA of this one; every warp reads x from L2;
//   step 16 (X_SMEM = false, K split over blockIdx.y): each slice stores its partial sums, and the last slice
//     of a tile to arrive adds them up in a fixed order (deterministic) and divides by the scale;
//   step 17 (X_SMEM = true): x copied into shared memory once per block.
#include "ternary_common.cuh"

// Steps 15 and 16: the B fragments of group gi straight from x in global memory (L2), where load_x_group reads
// them from the block's copy: the same pieces, the same values.
template <int MT>
__device__ __forceinline__ void load_x_group_global(uint4 (&xv)[MT][8], const unsigned short *x, int m0, int x_rows,
                                                    int x_stride, int K, int gi, int g, int t) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        const unsigned short *xr = x + (size_t)(m0 + min(8 * j + g, x_rows - 1)) * x_stride;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int k = gi * 256 + (4 * q + t) * 8;
            xv[j][q] = k + 8 <= K ? __ldg(reinterpret_cast<const uint4 *>(xr + k)) : load_x8_tail(xr, k, K);
        }
    }
}

// z[m, n] = sum_k x[m, k] W[n, k] / scale[n * scale_stride], W packed in the "2bit_mma" format
// (`groups` groups of 16 words a row). A block: `warps` warps, each RT tiles of 16 rows of W, all on
// the same slice of K (groups_per_slice groups) and the same 8 MT rows of x, which with X_SMEM the block first
// copies into shared memory (rather than every warp waiting on L2 once per group). With gridDim.y > 1
// the slices store partial sums in partials[slice][m][n] and arrivals[tile] counts them in (it is 0
// again when the kernel ends).
template <bool BF16, int MT, int RT, int STAGES, bool X_SMEM>
__global__ void __launch_bounds__(256) cuda_mma_kernel(
    const unsigned short *__restrict__ x, const uint4 *__restrict__ w, float *__restrict__ z,
    const float *__restrict__ scale, float *__restrict__ partials, u32 *__restrict__ arrivals, int M, int N, int K,
    int groups, int x_stride, int scale_stride, int groups_per_slice) {
    extern __shared__ uint4 xs[];  // [x row][32 pieces of 8 activations a group, + 4 of padding]
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int warps = blockDim.x >> 5;
    const int row0 = (blockIdx.x * warps + (threadIdx.x >> 5)) * RT * 16;
    const int m0 = blockIdx.z * 8 * MT, x_rows = min(8 * MT, M - m0);
    const int g_begin = blockIdx.y * groups_per_slice;
    const int g_end = min(g_begin + groups_per_slice, groups);
    // 64 bytes of padding a row: the 8 threads of one phase of a 16-byte shared load (rows g, g + 1,
    // pieces t) then hit 8 different 16-byte bank groups.
    const int xs_stride = groups_per_slice * 32 + 4;

    // "2bit_tiles": a group of a tile is 64 16-byte pieces, [half h][lane]. Tiles past the last one
    // read the last one (no branch in the loop); their rows are not stored.
    const int tiles = (N + 15) / 16;
    const uint4 *wrow[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            wrow[r][h] = w + (size_t)min(row0 / 16 + r, tiles - 1) * groups * 64 + 32 * h + lane;

    // The first STAGES groups of weights go out before the copy of x, and arrive during it.
    uint4 ring[STAGES][RT][2];
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
        if (g_begin + s < g_end)
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) ring[s][r][h] = load_weights(wrow[r][h] + (size_t)(g_begin + s) * 64);

    // x into shared memory (the weights above arrive meanwhile)
    if constexpr (X_SMEM) {
        copy_x_slice(xs, x, m0, x_rows, x_stride, K, g_begin, g_end, xs_stride, threadIdx.x, blockDim.x);
        __syncthreads();
    }

    float acc[2][RT][MT][4] = {};  // two sets: each MMA waits for the one before the one before it
    for (int gi = g_begin; gi < g_end; gi += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (gi + s < g_end) {
                uint4 xv[MT][8];
                if constexpr (X_SMEM) {
                    load_x_group<MT>(xv, xs, gi + s - g_begin, g, t, x_rows, xs_stride);
                } else {
                    load_x_group_global<MT>(xv, x, m0, x_rows, x_stride, K, gi + s, g, t);
                }
                uint4 a[RT][2];
#pragma unroll
                for (int r = 0; r < RT; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) a[r][h] = ring[s][r][h];
                if (gi + s + STAGES < g_end)  // the slot is free again: refill it STAGES groups ahead
#pragma unroll
                    for (int r = 0; r < RT; ++r)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            ring[s][r][h] = load_weights(wrow[r][h] + (size_t)(gi + s + STAGES) * 64);
                group_mma<BF16, MT, RT>(acc, a, xv);
            }
        }
    }

    const bool split = gridDim.y > 1;
    store_warp_sums<MT, RT>(acc, row0, m0, g, t, M, N, split ? (int)blockIdx.y : -1, z, scale, scale_stride,
                            partials);
    if (split)
        finish_split(arrivals, blockIdx.z * gridDim.x + blockIdx.x, gridDim.y, partials, z, scale, scale_stride, M,
                     N, blockIdx.x * warps * RT * 16, warps * RT * 16, m0, min(8 * MT, M - m0));
}
