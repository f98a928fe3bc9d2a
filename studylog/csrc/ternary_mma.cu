// Step 8: step 7's decode and layout, written by hand on mma.sync (ternary_mma <<<(row blocks,
// K slices, M blocks), 32 x warps>>>).
//
// Step 7 (Triton) decodes two weights per AND and one packed FMA straight into the MMA's A operand,
// yet on the H200 it ran at 4x the 2-bit floor for M = 1: Triton 3.6 waits for each MMA before it
// decodes the next operand, so the loads, the decode and the tensor cores take turns. Here the same
// words (step 7's "2bit_mma" words, reordered as "2bit_tiles") meet the same decode, but the
// schedule is ours:
//   * each thread loads its own A fragments with 16-byte loads, STAGES groups of 256 weights ahead
//     of the one it decodes (a ring of registers, no barrier in the loop); x is copied into shared
//     memory once per block;
//   * the decode is a LOP3 and an HFMA2 per two weights, and the products are mma.sync m16n8k16
//     with float32 accumulators: the decode of the next step overlaps the MMA of this one;
//   * K is split over blockIdx.y; each slice stores its partial sums, and the last slice of a
//     tile to arrive adds them up in a fixed order (deterministic) and divides by the scale.
//
// Fragments (PTX ISA, mma.m16n8k16, lane = 4 g + t): A holds rows g and g + 8 at columns 2t, 2t + 1
// (a0, a1) and 2t + 8, 2t + 9 (a2, a3); B holds column g at rows 2t, 2t + 1 (b0) and 2t + 8,
// 2t + 9 (b1); C holds rows g, g + 8 at columns 2t, 2t + 1. The MMA sums over its 16 columns in any
// order, so which 16 weights of a row form one step is ours to choose, as long as A and B agree.
// A group of the "2bit_mma" format holds row r's weights 32 p + 2 w + h in word w, bits 16 h + 2 p.
// Thread t reads words 4 t .. 4 t + 3 (one 16-byte load) of rows g and g + 8. Word 4 t + i, pair p
// holds the weights 32 p + 8 t + 2 i, + 1. In step (p, i2) (p = 0..7, i2 = 0, 1) a0 is pair p of word
// 4 t + 2 i2 and a2 pair p of the next word, so b0, b1 are x[32 p + 8 t + 4 i2 .. + 3]: for each p,
// the 8 consecutive activations from 32 p + 8 t make one 16-byte load of x for two steps.
//
// Weights are the "MMA's A" (16 rows of W a step) and x the B (8 of its rows a step): for M = 1 the
// tensor cores do 8x the useful work, which costs less than any decode on the CUDA cores would.

typedef unsigned int u32;
typedef unsigned long long u64;

// Weights and x in one 16-bit float type: bf16 (BF16 = true) or fp16. The decode, for pair p < 4 of
// both halves of a word: OR a magic constant into the word once (with_magic), then one AND keeps the
// two codes and the magic bits (one LOP3 with an immediate), which reads magic + code * 4^p exactly:
// for bf16 128 + code * 4^p (at p = 3 the code's high bit is the exponent's lowest, and 128, 192,
// 256 are still 128 + 64 code). One packed FMA, times 4^-p minus (magic 4^-p + 1), gives code - 1.
template <bool BF16>
__device__ __forceinline__ u32 with_magic(u32 bits) {
    return bits | (BF16 ? 0x43004300u : 0x64006400u);  // bf16 128.0, fp16 1024.0, in both halves
}

template <bool BF16>
__device__ __forceinline__ u32 decode_pair(u32 src, int p);

template <>
__device__ __forceinline__ u32 decode_pair<true>(u32 src, int p) {
    const u32 v = src & ((0x00030003u << (2 * p)) | 0x43004300u);
    // 4^-p and -(128 4^-p + 1), both exact in bf16, in both halves
    const u32 mul = p == 0 ? 0x3F803F80u : p == 1 ? 0x3E803E80u : p == 2 ? 0x3D803D80u : 0x3C803C80u;
    const u32 add = p == 0 ? 0xC301C301u : p == 1 ? 0xC204C204u : p == 2 ? 0xC110C110u : 0xC040C040u;
    u32 w;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(w) : "r"(v), "r"(mul), "r"(add));
    return w;
}

template <>
__device__ __forceinline__ u32 decode_pair<false>(u32 src, int p) {
    const u32 v = src & ((0x00030003u << (2 * p)) | 0x64006400u);
    // 4^-p and -(1024 4^-p + 1), exact in fp16
    const u32 mul = p == 0 ? 0x3C003C00u : p == 1 ? 0x34003400u : p == 2 ? 0x2C002C00u : 0x24002400u;
    const u32 add = p == 0 ? 0xE401E401u : p == 1 ? 0xDC04DC04u : p == 2 ? 0xD410D410u : 0xCC40CC40u;
    u32 w;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(w) : "r"(v), "r"(mul), "r"(add));
    return w;
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if constexpr (BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read once: keep them out of L1.
__device__ __forceinline__ uint4 load_weights(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// 8 activations x[k .. k + 7] of one row, zeros past K, one by one (the end of a row only).
__device__ __forceinline__ uint4 load_x8_tail(const unsigned short *row, int k, int K) {
    u32 h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = k + e < K ? (u32)__ldg(row + k + e) : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
}

__device__ __forceinline__ u32 part(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// One group (256 weights a row) of RT row tiles against MT column tiles of x. xv[j][p] holds
// x[32 p + 8 t .. + 7] of x row 8 j + g. Step (p, i2) multiplies pair p of words 2 i2 (a0, a1) and
// 2 i2 + 1 (a2, a3): their activations are neighbours, so b0 and b1 are two halves of one 8-byte
// piece of xv[j][p], an aligned register pair that the MMA takes without a move.
template <bool BF16, int MT, int RT>
__device__ __forceinline__ void group_mma(float (&acc)[2][RT][MT][4], const uint4 (&a)[RT][2], const uint4 (&xv)[MT][8]) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        u32 src[2][4][2];  // [row g / g + 8][word][pairs 0..3 / 4..7], magic OR-ed in
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                src[h][i][0] = with_magic<BF16>(part(a[r][h], i));
                src[h][i][1] = with_magic<BF16>(part(a[r][h], i) >> 8);
            }
#pragma unroll
        for (int p = 0; p < 8; ++p)
#pragma unroll
            for (int i2 = 0; i2 < 2; ++i2) {
                const u32 a0 = decode_pair<BF16>(src[0][2 * i2][p >> 2], p & 3);
                const u32 a1 = decode_pair<BF16>(src[1][2 * i2][p >> 2], p & 3);
                const u32 a2 = decode_pair<BF16>(src[0][2 * i2 + 1][p >> 2], p & 3);
                const u32 a3 = decode_pair<BF16>(src[1][2 * i2 + 1][p >> 2], p & 3);
#pragma unroll
                for (int j = 0; j < MT; ++j)
                    mma16816<BF16>(acc[i2][r][j], a0, a1, a2, a3, part(xv[j][p], 2 * i2), part(xv[j][p], 2 * i2 + 1));
            }
    }
}

// z[m, n] = sum_k x[m, k] W[n, k] / scale[n * scale_stride], W packed in the "2bit_mma" format
// (`groups` groups of 16 words a row). A block: `warps` warps, each RT tiles of 16 rows of W, all on
// the same slice of K (groups_per_slice groups) and the same 8 MT rows of x, which the block first
// copies into shared memory: every warp reads them from there, at shared-memory latency, instead
// of waiting on L2 once per group (dynamic shared memory: x_smem_bytes(), see the wrapper).
// With gridDim.y > 1 the slices store partial sums in partials[slice][m][n] and arrivals[tile]
// counts them in (it is 0 again when the kernel ends).
template <bool BF16, int MT, int RT, int STAGES>
__global__ void __launch_bounds__(256) ternary_mma(const unsigned short *__restrict__ x, const uint4 *__restrict__ w,
                                                   float *__restrict__ z, const float *__restrict__ scale,
                                                   float *__restrict__ partials, u32 *__restrict__ arrivals, int M,
                                                   int N, int K, int groups, int x_stride, int scale_stride,
                                                   int groups_per_slice) {
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

    // x[m0 .., this slice of K] into shared memory, zeros past K (the padding weights are zeros too,
    // so the last group needs no special case below).
    const int pieces = (g_end - g_begin) * 32;
    for (int idx = threadIdx.x; idx < x_rows * pieces; idx += blockDim.x) {
        const int row = idx / pieces, piece = idx - row * pieces;
        const int k = g_begin * 256 + piece * 8;
        const unsigned short *xr = x + (size_t)(m0 + row) * x_stride;
        xs[row * xs_stride + piece] =
            k + 8 <= K ? __ldg(reinterpret_cast<const uint4 *>(xr + k)) : load_x8_tail(xr, k, K);
    }
    __syncthreads();

    float acc[2][RT][MT][4] = {};  // two sets: each MMA waits for the one before the one before it
    for (int gi = g_begin; gi < g_end; gi += STAGES) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (gi + s < g_end) {
                // Column n of the product depends on column n of B only, held by the lanes g = n. Lanes
                // whose x row is past M read the last row instead of zeros: their columns are never
                // stored, and no branch or zeroing is spent on them.
                uint4 xv[MT][8];
#pragma unroll
                for (int j = 0; j < MT; ++j)
#pragma unroll
                    for (int q = 0; q < 8; ++q)
                        xv[j][q] = xs[min(8 * j + g, x_rows - 1) * xs_stride + (gi + s - g_begin) * 32 + 4 * q + t];
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

    // C fragments: rows n = row0 + 16 r + 8 h + g, columns m = m0 + 8 j + 2 t + e.
    const bool split = gridDim.y > 1;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int n = row0 + 16 * r + 8 * (c >> 1) + g, m = m0 + 8 * j + 2 * t + (c & 1);
                if (n >= N || m >= M) continue;
                if (split)
                    partials[((size_t)blockIdx.y * M + m) * N + n] = acc[0][r][j][c] + acc[1][r][j][c];
                else
                    z[(size_t)m * N + n] = (acc[0][r][j][c] + acc[1][r][j][c]) / scale[(size_t)n * scale_stride];
            }
    if (!split) return;

    // The last slice of this tile to arrive adds the partial sums, slice by slice (a fixed order).
    __shared__ bool last;
    __threadfence();  // this thread's partial sums are visible to every SM before the count moves
    __syncthreads();
    const u32 tile = blockIdx.z * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) last = atomicAdd(&arrivals[tile], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int rows = warps * RT * 16, n_base = blockIdx.x * rows, cols = min(8 * MT, M - m0);
    for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
        const int n = n_base + idx % rows, m = m0 + idx / rows;
        if (n >= N) continue;
        float sum = 0.0f;
        for (int s = 0; s < (int)gridDim.y; ++s) sum += __ldcg(&partials[((size_t)s * M + m) * N + n]);
        z[(size_t)m * N + n] = sum / scale[(size_t)n * scale_stride];
    }
    if (threadIdx.x == 0) arrivals[tile] = 0;  // ready for the next launch
}
