// Shared by steps 15 to 21 (ternary_mma.cu, ternary_bulk.cu): the decode of step 14's 2-bit words
// into the tensor cores' A operand, the mma.sync itself, and one group of 256 weights a row.
#pragma once

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

// The probe builds of steps 21 and 23 (-DBULK_PROBE, -DW2A8_PROBE; PROBES in cuda_steps.py, the same numbers):
// the kernel itself, or with parts left out: the copies only, the arithmetic only, or nothing.
enum Probe { PROBE_NONE = 0, PROBE_COPIES_ONLY = 1, PROBE_ARITHMETIC_ONLY = 2, PROBE_LAUNCH_ONLY = 3 };

// Weights and x in one 16-bit float type: bf16 (BF16 = true) or fp16. The decode, for pair p < 4 of
// both halves of a word: OR a magic constant into the word once (with_magic), then one AND keeps the
// two codes and the magic bits (one LOP3 with an immediate), which reads magic + code * 4^p exactly:
// for bf16 128 + code * 4^p (at p = 3 the code's high bit is the exponent's lowest, and 128, 192,
// 256 are still 128 + 64 code). One packed FMA, times 4^-p minus (magic 4^-p + 1), gives code - 1.
template <bool BF16>
__device__ __forceinline__ u32 with_magic(u32 bits) {
    return bits | (BF16 ? 0x43004300u : 0x64006400u);  // bf16 128.0, fp16 1024.0, in both halves
}

// v * 4^-p - (magic 4^-p + 1) in both halves, for v = magic + code * 4^p: code - 1, exactly.
template <bool BF16>
__device__ __forceinline__ u32 decode_fma(u32 v, int p) {
    u32 w;
    if constexpr (BF16) {
        // 4^-p and -(128 4^-p + 1), both exact in bf16, in both halves
        const u32 mul = p == 0 ? 0x3F803F80u : p == 1 ? 0x3E803E80u : p == 2 ? 0x3D803D80u : 0x3C803C80u;
        const u32 add = p == 0 ? 0xC301C301u : p == 1 ? 0xC204C204u : p == 2 ? 0xC110C110u : 0xC040C040u;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(w) : "r"(v), "r"(mul), "r"(add));
    } else {
        // 4^-p and -(1024 4^-p + 1), exact in fp16
        const u32 mul = p == 0 ? 0x3C003C00u : p == 1 ? 0x34003400u : p == 2 ? 0x2C002C00u : 0x24002400u;
        const u32 add = p == 0 ? 0xE401E401u : p == 1 ? 0xDC04DC04u : p == 2 ? 0xD410D410u : 0xCC40CC40u;
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(w) : "r"(v), "r"(mul), "r"(add));
    }
    return w;
}

// Pair p of a word with the magic ORed in (with_magic): one AND keeps its codes and the magic.
template <bool BF16>
__device__ __forceinline__ u32 decode_pair(u32 src, int p) {
    return decode_fma<BF16>(src & ((0x00030003u << (2 * p)) | (BF16 ? 0x43004300u : 0x64006400u)), p);
}

// Step 21's decode of pair p (< 4) of both halves of a word: the same value, with the magic bits ORed
// in by the same LOP3 that keeps the codes, (src & mask) | magic. Steps 15 to 20 write the C++ AND
// src & (mask | magic), and ptxas rebuilds the 32-bit constant in a fresh register (an IMAD.MOV) before each
// LOP3; this inline LOP3 takes the constant as a register operand, so ptxas builds it once, not per LOP3.
// `magic` is also read from shared memory, so ptxas cannot build it at all (exercise 6 writes it as a literal).
template <bool BF16>
__device__ __forceinline__ u32 decode_pair_reg(u32 src, int p, u32 magic) {
    u32 v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(src), "r"(0x00030003u << (2 * p)), "r"(magic));
    return decode_fma<BF16>(v, p);
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
// MAGIC_REG (step 21): decode with decode_pair_reg and the magic in a register (`magic`), instead of
// ORing it into the words first.
template <bool BF16, int MT, int RT, bool MAGIC_REG = false>
__device__ __forceinline__ void group_mma(float (&acc)[2][RT][MT][4], const uint4 (&a)[RT][2], const uint4 (&xv)[MT][8],
                                          u32 magic = 0) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        u32 src[2][4][2];  // [row g / g + 8][word][pairs 0..3 / 4..7], magic OR-ed in (steps 15 to 20)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                src[h][i][0] = MAGIC_REG ? part(a[r][h], i) : with_magic<BF16>(part(a[r][h], i));
                src[h][i][1] = MAGIC_REG ? part(a[r][h], i) >> 8 : with_magic<BF16>(part(a[r][h], i) >> 8);
            }
        auto decode = [&](u32 word, int p) {
            return MAGIC_REG ? decode_pair_reg<BF16>(word, p, magic) : decode_pair<BF16>(word, p);
        };
#pragma unroll
        for (int p = 0; p < 8; ++p)
#pragma unroll
            for (int i2 = 0; i2 < 2; ++i2) {
                const u32 a0 = decode(src[0][2 * i2][p >> 2], p & 3);
                const u32 a1 = decode(src[1][2 * i2][p >> 2], p & 3);
                const u32 a2 = decode(src[0][2 * i2 + 1][p >> 2], p & 3);
                const u32 a3 = decode(src[1][2 * i2 + 1][p >> 2], p & 3);
#pragma unroll
                for (int j = 0; j < MT; ++j)
                    mma16816<BF16>(acc[i2][r][j], a0, a1, a2, a3, part(xv[j][p], 2 * i2), part(xv[j][p], 2 * i2 + 1));
            }
    }
}

// x[m0 .. m0 + x_rows, groups g_begin .. g_end) into shared memory, 8 activations a 16-byte piece,
// zeros past K (the padding weights are zeros too, so the last group needs no special case). Row
// `row` starts at piece row * xs_stride; threads tid, tid + nthreads, ... share the copy.
__device__ __forceinline__ void copy_x_slice(uint4 *xs, const unsigned short *x, int m0, int x_rows, int x_stride,
                                             int K, int g_begin, int g_end, int xs_stride, int tid, int nthreads) {
    const int pieces = (g_end - g_begin) * 32;
    for (int idx = tid; idx < x_rows * pieces; idx += nthreads) {
        const int row = idx / pieces, piece = idx - row * pieces;
        const int k = g_begin * 256 + piece * 8;
        const unsigned short *xr = x + (size_t)(m0 + row) * x_stride;
        xs[row * xs_stride + piece] =
            k + 8 <= K ? __ldg(reinterpret_cast<const uint4 *>(xr + k)) : load_x8_tail(xr, k, K);
    }
}

// The B fragments of one group (group gl of the slice in shared memory): xv[j][q] holds
// x[32 q + 8 t .. + 7] of x row 8 j + g. Column n of the product depends on column n of B only,
// held by the lanes g = n. Lanes whose x row is past M read the last row instead of zeros: their
// columns are never stored, and no branch or zeroing is spent on them.
template <int MT>
__device__ __forceinline__ void load_x_group(uint4 (&xv)[MT][8], const uint4 *xs, int gl, int g, int t, int x_rows,
                                             int xs_stride) {
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 8; ++q) xv[j][q] = xs[min(8 * j + g, x_rows - 1) * xs_stride + gl * 32 + 4 * q + t];
}

// out(r, j, c, n, m) for each value c of a warp's C fragments (RT tiles of 16 weight rows by MT of 8 x rows) that
// lies in z: row n = row0 + 16 r + 8 h + g, column m = m0 + 8 j + 2 t + e, where c = 2 h + e; n < N and m < M.
template <int MT, int RT, typename Out>
__device__ __forceinline__ void for_each_output(int row0, int m0, int g, int t, int M, int N, Out out) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int n = row0 + 16 * r + 8 * (c >> 1) + g, m = m0 + 8 * j + 2 * t + (c & 1);
                if (n >= N || m >= M) continue;
                out(r, j, c, n, m);
            }
}

// A warp's results, from its C fragments: z = sum / scale, or, when K is split (slice >= 0), the partial sum
// into partials[slice][m][n].
template <int MT, int RT>
__device__ __forceinline__ void store_warp_sums(const float (&acc)[2][RT][MT][4], int row0, int m0, int g, int t,
                                                int M, int N, int slice, float *z, const float *scale,
                                                int scale_stride, float *partials) {
    for_each_output<MT, RT>(row0, m0, g, t, M, N, [&](int r, int j, int c, int n, int m) {
        const float sum = acc[0][r][j][c] + acc[1][r][j][c];
        if (slice >= 0)
            partials[((size_t)slice * M + m) * N + n] = sum;
        else
            z[(size_t)m * N + n] = sum / scale[(size_t)n * scale_stride];
    });
}

// Split K, after every thread of the block stored its partial sums: the last of the `slices` blocks
// of output tile `tile` (rows n_base .., x rows m0 .. m0 + cols) to arrive adds the partial sums
// slice by slice (a fixed order, so the result is deterministic), hands each total to
// store(m, n, sum), and resets arrivals[tile] to 0 for the next launch. Every thread of the block
// calls it. (T: float in steps 16 to 21, int in steps 22 to 25.)
template <typename T, typename Store>
__device__ __forceinline__ void finish_split_with(u32 *arrivals, u32 tile, int slices, const T *partials, int M,
                                                  int N, int n_base, int rows, int m0, int cols, Store store) {
    __shared__ bool last;
    __threadfence();  // this thread's partial sums are visible to every SM before the count moves
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&arrivals[tile], 1u) == (u32)slices - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // B outputs a thread at a time, their slices' loads issued together: one output at a time would make a
    // chain of slices x outputs-a-thread L2 round trips
    constexpr int B = 4;
    const int total = rows * cols;
    for (int i0 = threadIdx.x; i0 < total; i0 += B * blockDim.x) {
        T sum[B];
        size_t at[B];
        bool valid[B];
#pragma unroll
        for (int b = 0; b < B; ++b) {
            const int idx = i0 + b * blockDim.x, n = n_base + idx % rows, m = m0 + idx / rows;
            valid[b] = idx < total && n < N;
            at[b] = (size_t)m * N + n;
            sum[b] = 0;
        }
#pragma unroll 4
        for (int s = 0; s < slices; ++s) {
            T v[B];
#pragma unroll
            for (int b = 0; b < B; ++b) v[b] = valid[b] ? __ldcg(&partials[(size_t)s * M * N + at[b]]) : T(0);
#pragma unroll
            for (int b = 0; b < B; ++b) sum[b] += v[b];  // slice by slice: a fixed order, a deterministic sum
        }
#pragma unroll
        for (int b = 0; b < B; ++b)
            if (valid[b]) store((int)(at[b] / N), (int)(at[b] % N), sum[b]);
    }
    if (threadIdx.x == 0) arrivals[tile] = 0;
}

// The steps that split K across blocks (from step 16): z = (sum of the slices) / scale.
__device__ __forceinline__ void finish_split(u32 *arrivals, u32 tile, int slices, const float *partials, float *z,
                                             const float *scale, int scale_stride, int M, int N, int n_base,
                                             int rows, int m0, int cols) {
    finish_split_with(arrivals, tile, slices, partials, M, N, n_base, rows, m0, cols, [&](int m, int n, float sum) {
        z[(size_t)m * N + n] = sum / scale[(size_t)n * scale_stride];
    });
}
