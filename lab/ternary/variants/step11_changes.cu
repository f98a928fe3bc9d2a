// Step 11 (studylog/ternary/csrc/ternary_bulk.cu, step11_tma_kernel) frozen, with two of the changes it bundles
// with the ring as compile-time knobs (lab/ternary/step11_changes.py launches it; the third, the split-K ending,
// is a launch knob: grid.y > 1 takes finish_split as the library's kernel does):
//   MAGIC_REG    true: step 11's decode, the magic constant read once from shared memory, so ptxas keeps it in
//                one register (decode_pair_reg); false: step 10's form, the constant ORed into each word and
//                into each LOP3's mask (decode_pair), which ptxas rebuilds by an IMAD.MOV before every LOP3.
//                Both give the same bits (with_magic(b) & (mask | magic) == (b & mask) | magic).
//   WARP_COPIES  false: step 11's few, large copies, one a stage and tile (warps x CHUNK groups); true: one copy
//                a stage, tile and consumer warp (CHUNK groups, 1 KiB at CHUNK = 1), into the same places of the
//                stage, so the consumers read the same words.
// With MAGIC_REG = true and WARP_COPIES = false the kernel body is step11_tma_kernel's, line for line (its
// probes left out: BULK_PROBE is PROBE_NONE here), and compiles to the library's SASS.
#include "ternary_common.cuh"
#include "ternary_ring.cuh"

// WeightRing::fill with one copy per consumer warp and tile: warp i's CHUNK groups of chunk c of tile r land
// where the ring's one copy of the tile puts them ([row tile][warp][group]), the same bytes in all.
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

template <bool BF16, int MT, int RT, int STAGES, int CHUNK, bool MAGIC_REG, bool WARP_COPIES>
__global__ void __launch_bounds__(RT * MT == 1 ? 544 : 288) step11_changes_kernel(
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
            for (int c = 0; c < chunks; ++c) {
                if (WARP_COPIES)
                    fill_per_warp(ring, c, warps, policy);
                else
                    ring.fill(c, policy);
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
            const int ng = ring.take(c, warp, lane, a, true);
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
