// Steps 18 to 21: step 17's decode and MMAs, fed by the Tensor Memory Accelerator (tma_kernel <<<(row tiles /
// RT, K slices, M blocks), 32 x (warps + 1)>>>, Hopper and later), one template whose knobs and launch are the
// four steps. Step 17 kept too few weights in flight in registers and split K across blocks (a round trip
// through L2 at the end); these steps change the plumbing, not the arithmetic:
//   * step 18 (WARP_COPIES, K split as step 17 splits it): one producer warp (the block's last) has the copy
//     engine move the weights from global to shared memory (cp.async.bulk, no registers, no address
//     arithmetic per thread) into a ring of STAGES stages; a stage's "full" mbarrier counts its bytes in, its
//     "empty" mbarrier counts the consumer warps out, and the producer refills it then; one copy a stage, tile
//     and consumer warp. x comes in by the same engine, issued first, so its wait overlaps the weights' wait;
//   * step 19 (one slice of K): a block owns RT tiles of 16 rows and its consumer warps share the block's K:
//     in each stage, warp i takes groups i CHUNK .. i CHUNK + CHUNK - 1 of the stage's warps x CHUNK groups.
//     The warps add their partial sums in shared memory at the end, in a fixed order: no split of K across
//     blocks, no round trip through L2, and the result is deterministic. (K is split across blocks only when
//     a block's x would not fit in shared memory; then as in step 16.)
//   * step 20 (WARP_COPIES = false): the warps' groups of a stage are consecutive in the "2bit_tiles" format,
//     so a stage is one copy per tile (the TMA has a cost per copy);
//   * step 21 (MAGIC_REG): the decode's magic constant sits in a register (decode_pair_reg), which saves
//     ptxas's IMAD.MOV before each of its LOP3s.
#include "ternary_common.cuh"
#include "ternary_ring.cuh"

// Step 18: WeightRing::fill with one copy per consumer warp and tile: warp i's CHUNK groups of chunk c of tile r
// land where the ring's one copy of the tile puts them ([row tile][warp][group]), the same bytes in all.
template <int RT, int STAGES, int CHUNK>
__device__ __forceinline__ void fill_per_warp(const WeightRing<RT, STAGES, CHUNK> &ring, int c, int warps,
                                              u64 policy) {
    const int s = c % STAGES;
    if (c >= STAGES) mbarrier_wait(&ring.empty[s], ((c / STAGES) - 1) & 1);
    const int gc = ring.g_begin + c * ring.per_chunk;
    const int ng = min(ring.per_chunk, ring.g_end - gc);
    mbarrier_expect_bytes(&ring.full[s], (u32)ng * 1024u * RT);
    for (int r = 0; r < RT; ++r)
        for (int i = 0; i < warps && i * CHUNK < ng; ++i)
            bulk_copy(ring.stages + s * ring.stage_pieces + (r * ring.per_chunk + i * CHUNK) * 64,
                      ring.w + ((size_t)min(ring.tile0 + r, ring.tiles - 1) * ring.groups + gc + i * CHUNK) * 64,
                      (u32)min(CHUNK, ng - i * CHUNK) * 1024u, &ring.full[s], policy);
}

// Probes (compiled with -DBULK_PROBE=...; PROBE_* in ternary_common.cuh): the kernel with parts left out.
#ifndef BULK_PROBE
#define BULK_PROBE PROBE_NONE
#endif

// z[m, n] = sum_k x[m, k] W[n, k] / scale[n * scale_stride], W in the "2bit_tiles" format, as step 17,
// but a block owns RT tiles (16 RT rows of W) and its `warps` consumer warps split the block's slice
// of K among themselves. K is split over blockIdx.y as well only when the block's x would not fit in
// shared memory; then finish_split sums the slices as in step 16. K must be a multiple of 8 and x's rows
// must start on 16-byte boundaries (the wrapper pads x otherwise). Dynamic shared memory:
// RING_BARRIER_BYTES, STAGES stages of warps x RT x CHUNK groups (1 KiB each), then x (x rows of
// groups_per_slice x 32 pieces + 4 of padding). Up to 16 consumer warps with one tile of W and of x, else 8.
template <bool BF16, int MT, int RT, int STAGES, int CHUNK, bool WARP_COPIES, bool MAGIC_REG>
__global__ void __launch_bounds__(RT * MT == 1 ? 544 : 288) tma_kernel(
    const unsigned short *__restrict__ x, const uint4 *__restrict__ w, float *__restrict__ z,
    const float *__restrict__ scale, float *__restrict__ partials, u32 *__restrict__ arrivals, int M, int N, int K,
    int groups, int x_stride, int scale_stride, int groups_per_slice) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warps = (blockDim.x >> 5) - 1, warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.z * 8 * MT, x_rows = min(8 * MT, M - m0);
    const WeightRing<RT, STAGES, CHUNK> ring(smem, w, warps, N, groups, groups_per_slice);
    const int g_begin = ring.g_begin, g_end = ring.g_end, tile0 = ring.tile0;
    u64 *x_ready = ring.spare_barriers();
    uint4 *xs = ring.after();
    const int chunks = ring.chunks();
    const int xs_stride = groups_per_slice * 32 + 4;
    const int k_begin = g_begin * 256, k_end = min(g_end * 256, K);

    if (BULK_PROBE == PROBE_LAUNCH_ONLY) return;
    if (threadIdx.x == 0) {
        ring.init(warps);
        mbarrier_init(x_ready, 1);
        *reinterpret_cast<u32 *>(x_ready + 1) = BF16 ? 0x43004300u : 0x64006400u;  // the decode's magic
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the copy engine
    }
    __syncthreads();

    if (warp == warps) {
        // The producer: one thread; x first, then the chunks.
        if (lane == 0) {
            const u64 policy = evict_first_policy();
            const u32 x_bytes = (u32)(k_end - k_begin) * 2u;
            mbarrier_expect_bytes(x_ready, x_bytes * x_rows);
            for (int row = 0; row < x_rows; ++row)
                bulk_copy(xs + row * xs_stride, x + (size_t)(m0 + row) * x_stride + k_begin, x_bytes, x_ready,
                          policy);
            for (int c = 0; BULK_PROBE != PROBE_ARITHMETIC_ONLY && c < chunks; ++c) {
                if constexpr (WARP_COPIES) {
                    fill_per_warp(ring, c, warps, policy);
                } else {
                    ring.fill(c, policy);
                }
            }
        }
        __syncwarp();
    } else {
        // Past K the weights are zeros, and x must be finite there (0 x NaN is NaN): zero its tail.
        const int pieces = (g_end - g_begin) * 32, valid = (k_end - k_begin) / 8;
        for (int idx = threadIdx.x; idx < x_rows * (pieces - valid); idx += warps * 32)
            xs[(idx / (pieces - valid)) * xs_stride + valid + idx % (pieces - valid)] = make_uint4(0, 0, 0, 0);
        consumer_barrier(warps);
        mbarrier_wait(x_ready, 0);

        const u32 magic = *reinterpret_cast<volatile u32 *>(x_ready + 1);  // see decode_pair_reg
        float acc[2][RT][MT][4] = {};
        for (int c = 0; c < chunks; ++c) {
            uint4 a[CHUNK][RT][2];
            const int gc = ring.group(c, warp);
            const int ng = ring.take(c, warp, lane, a, BULK_PROBE != PROBE_ARITHMETIC_ONLY);
            if (BULK_PROBE == PROBE_COPIES_ONLY) {  // keep the loads: fold the words into the accumulators' bits
#pragma unroll
                for (int cg = 0; cg < CHUNK; ++cg)
                    if (cg < ng) acc[0][0][0][0] += __int_as_float(a[cg][0][0].x ^ a[cg][RT - 1][1].w) * 0.0f;
                continue;
            }
#pragma unroll
            for (int cg = 0; cg < CHUNK; ++cg)
                if (cg < ng) {
                    uint4 xv[MT][8];
                    load_x_group<MT>(xv, xs, gc + cg - g_begin, g, t, x_rows, xs_stride);
                    group_mma<BF16, MT, RT, MAGIC_REG>(acc, a[cg], xv, magic);
                }
        }

        // The warps' sums, in the stages (every copy has landed and been read).
        add_warp_sums<RT, MT>(reinterpret_cast<float *>(ring.stages), warps, x_rows,
                              [&](int r, int j, int c) { return acc[0][r][j][c] + acc[1][r][j][c]; },
                              [&](int row, int col, float sum) {
                                  const int n = tile0 * 16 + row, m = m0 + col;
                                  if (n >= N) return;
                                  if (gridDim.y > 1)
                                      partials[((size_t)blockIdx.y * M + m) * N + n] = sum;
                                  else
                                      z[(size_t)m * N + n] = sum / scale[(size_t)n * scale_stride];
                              });
    }
    if (gridDim.y > 1)
        finish_split(arrivals, blockIdx.z * gridDim.x + blockIdx.x, gridDim.y, partials, z, scale, scale_stride, M,
                     N, tile0 * 16, 16 * RT, m0, x_rows);
}
