// Steps 22 and 23: W2A8. The weights of steps 15 to 21 ("2bit_tiles"), x quantised to int8 as BitNet b1.58
// does it (one absmax scale a row of x), and exact int32 sums on the tensor cores' int8 MMA. Step 21 spends
// two instructions to turn 2 weights into bf16; with int8 activations the tensor cores take the weights'
// codes as they lie in the words, 4 at a time:
//   * a 2bit_tiles word holds a code (weight + 1, in {0, 1, 2}) at bits 2 p' of each of its 4 bytes
//     for p' = 0..3. One AND with 0x03030303 << 2 p' leaves, in every byte, code << 2 p': four
//     unsigned 8-bit numbers, an A register of mma.m16n8k32.u8.s8 as it is. One LOP3 per 4 weights,
//     no other decode;
//   * code << 2 p' is 4^p' times the code, so each p' gets its own int32 accumulator, and the four
//     are added at the end as acc0 + acc1 / 4 + acc2 / 16 + acc3 / 64 (exact shifts);
//   * the codes are weight + 1: sum_k x_k code_k = sum_k x_k w_k + sum_k x_k. The row sums of the
//     quantised x are subtracted once, at the end;
//   * which 32 weights of a row form one MMA step is ours to choose, as long as x matches: the
//     quantisation writes x's bytes in the order the B fragments want them (below), so that a
//     thread's B registers for a whole group are 4 conflict-free 16-byte loads from shared memory.
// The TMA ring, the sums across warps and the split of K are step 21's; x is not: it must come before the
// weights flood DRAM (see the kernel). Steps 24 and 25, for several rows of x, are at the end of this file.
#include "ternary_common.cuh"
#include "ternary_ring.cuh"

// The timeline (compiled with -DW2A8_TIMELINE=1): the kernels take one more argument, `trace`, where thread 0
// of each block (and of quantize_x) writes %globaltimer at its start and end and clock64() since its start:
// slots 64 b + i of block b (b counted x fastest), 1 x quantised, 2 loop over the weights done, 3 sums stored,
// 4 + c chunk c taken (c < 24), 32 + c chunk c asked for by the producer, 56 x read; quantize_x writes slots
// 120000 and 120001. Off by default: then every W2A8_* macro below expands to nothing.
#ifndef W2A8_TIMELINE
#define W2A8_TIMELINE 0
#endif
#if W2A8_TIMELINE
#define W2A8_TRACE_PARAM , unsigned long long *__restrict__ trace
#define W2A8_NOW(v) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v))
#define W2A8_BLOCK (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))
#define W2A8_START                                                                                              \
    const long long t_start = clock64();                                                                      \
    if (threadIdx.x == 0) W2A8_NOW(trace[64 * W2A8_BLOCK])
#define W2A8_STAMP(i) (trace[64 * W2A8_BLOCK + (i)] = (unsigned long long)(clock64() - t_start))
#define W2A8_END                                                                                                \
    if (threadIdx.x == 0) {                                                                                   \
        W2A8_STAMP(3);                                                                                        \
        W2A8_NOW(trace[64 * W2A8_BLOCK + 63]);                                                                \
    }
#define W2A8_AT(condition, i)                                                                                   \
    if (condition) W2A8_STAMP(i)
#else
#define W2A8_TRACE_PARAM
#define W2A8_START
#define W2A8_END
#define W2A8_AT(condition, i)
#endif

// x's order in one group (256 activations, 256 bytes): byte 64 p' + 16 t + 4 i + j holds x[k] with
// k = 32 p' + 2 (4 t + i) + 128 (j & 1) + (j >> 1): the activation that meets code p' of byte j of
// word 4 t + i of a weight row, in the B register i of thread t (mma fragments: lane = 4 g + t);
// w2a8_x_order (tests/test_ternary_cuda.py) computes the same. The quantisation writes it 16 bytes (a unit) at a time.

template <bool BF16>
__device__ __forceinline__ float half_to_float(unsigned short bits) {
    if constexpr (BF16) {
        return __uint_as_float((u32)bits << 16);
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
        return f;
    }
}

// Where quantize_row reads a row of x from, 8 activations x[k .. k + 7] (k a multiple of 8) at a time,
// zeros past K. GlobalRow: from global memory (16-byte loads: rows start on 16-byte boundaries, the
// wrapper sees to it). StagedRow (QUANT_STAGED): the copy engine has put the row's first K & ~7 activations
// into shared memory (`staged`), which holds every 16-byte piece GlobalRow would load; the last K % 8,
// one by one, still come from global memory.
struct GlobalRow {
    const unsigned short *row;
    int K;
    __device__ uint4 operator()(int k) const {
        return k + 8 <= K ? __ldg(reinterpret_cast<const uint4 *>(row + k)) : load_x8_tail(row, k, K);
    }
};
struct StagedRow {
    const uint4 *staged;
    const unsigned short *row;
    int K;
    __device__ uint4 operator()(int k) const { return k + 8 <= K ? staged[k >> 3] : load_x8_tail(row, k, K); }
};

// The 16 activations of unit u = 16 G + 4 p' + t of a row: x[k0 .. k0 + 7] and x[k0 + 128 .. k0 + 135]
// for k0 = 256 G + 32 p' + 8 t.
template <typename Row>
__device__ __forceinline__ void load_unit(uint4 (&v)[2], const Row &row, int u) {
    const int k0 = (u >> 4) * 256 + 32 * ((u >> 2) & 3) + 8 * (u & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) v[h] = row(k0 + 128 * h);
}

template <bool BF16>
__device__ __forceinline__ float piece_absmax(const uint4 &v) {
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const u32 word = part(v, e);
        a = fmaxf(a, fmaxf(fabsf(half_to_float<BF16>(word & 0xFFFF)), fabsf(half_to_float<BF16>(word >> 16))));
    }
    return a;
}

// q = round-half-even(f x scale) as the low byte of a float's bits. Adding 1.5 x 2^23 to a float t
// with |t| < 2^22 leaves a float whose unit in the last place is 1, so the addition itself rounds t
// to an integer, half to even, and its low mantissa byte is that integer's two's-complement byte: an
// FMUL and an FADD (full rate) instead of rintf and a float-to-int conversion (quarter rate). Kept apart
// (no fused multiply-add), so the product is rounded to float first, as torch rounds it. The lower clamp
// maps a NaN product to -128.
__device__ __forceinline__ u32 rounded_bits(float f, float scale) {
    return __float_as_uint(__fadd_rn(fmaxf(__fmul_rn(f, scale), -128.0f), 12582912.0f));
}

// The 16 bytes of a unit (v: its two pieces of 8 activations): word w holds q of x[k0 + 2 w],
// x[k0 + 128 + 2 w], x[k0 + 2 w + 1], x[k0 + 128 + 2 w + 1]; adds the q to `sum`.
template <bool BF16>
__device__ __forceinline__ uint4 quantize_unit(const uint4 (&v)[2], float scale, int &sum) {
    u32 words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // byte j: x[k0 + 128 (j & 1) + 2 w + (j >> 1)]
            const u32 pair = part(v[j & 1], w);
            b[j] = rounded_bits(half_to_float<BF16>((j >> 1) ? pair >> 16 : pair & 0xFFFF), scale);
        }
        // the four low bytes into one word, then their sum (signed bytes, one dp4a)
        words[w] = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
        sum = __dp4a((int)words[w], 0x01010101, sum);
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
}

// BitNet's scale of a row from its largest |x|: torch's 127 / t is a reciprocal, then a product.
__device__ __forceinline__ float row_scale(float amax) { return (1.0f / fmaxf(amax, 1e-5f)) * 127.0f; }

// Unit i of a row of `units`, counted from unit rot (< units). All the blocks of the matmul read the same
// x; starting each at a different unit spreads their loads over L2's slices (every block reading the same
// x in the same order queue on the same slices).
__device__ __forceinline__ int rotated(int i, int rot, int units) {
    return i + rot < units ? i + rot : i + rot - units;
}

// The groups (of 256 activations, 16 units) of a row of x that block `part` of `parts` quantises.
struct RowShare {
    int first, count;
    __device__ RowShare(int part, int parts, int groups)
        : first(part * groups / parts), count((part + 1) * groups / parts - part * groups / parts) {}
};

// BitNet's activation quantisation of one row of x, bit for bit as quantize_activations in Python (float32
// throughout): scale = (1 / max(max_k |x_k|, 1e-5)) * 127, q = clamp(round-half-even(x * scale), -128, 127).
// Threads tid = 0 .. nthreads - 1 (whole warps, `sync` a barrier of exactly them) share the block's `share`;
// UNITS units of 16 activations a thread stay in registers between the two passes (x is read once while
// K <= UNITS x 16 x nthreads), taken from their `spread`-th group on (see rotated). max_all and sum_all turn
// the block's max |x| and sum of q into the row's. Writes the bytes in the order above to `out` (zeros past
// K; unit u is bytes 16 u .. 16 u + 15 of the row) and returns the row's scale and sum of q.
template <bool BF16, int UNITS, typename Row, typename Sync, typename MaxAll, typename SumAll>
__device__ __forceinline__ void quantize_row(const Row &row, int groups, RowShare share, uint4 *out,
                                             int tid, int nthreads, int spread, Sync sync, MaxAll max_all,
                                             SumAll sum_all, float &scale, int &total) {
    __shared__ float warp_max[32];
    __shared__ int warp_sum[32];
    const int lane = tid & 31, warp = tid >> 5, warps = nthreads >> 5;
    const int units = share.count * 16, per_round = UNITS * nthreads, first = share.first * 16;
    const int rot = share.count ? (spread % share.count) * 16 : 0;
    uint4 v[UNITS][2];
    float amax = 0.0f;
    for (int r0 = 0; r0 < units; r0 += per_round) {
#pragma unroll
        for (int i = 0; i < UNITS; ++i) {
            const int n = r0 + tid + i * nthreads;  // the thread's n-th unit of the row, from rot on
            if (n < units) {
                load_unit(v[i], row, first + rotated(n, rot, units));
                amax = fmaxf(amax, fmaxf(piece_absmax<BF16>(v[i][0]), piece_absmax<BF16>(v[i][1])));
            }
        }
    }
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
    if (lane == 0) warp_max[warp] = amax;
    sync();
    amax = 0.0f;
    for (int i = 0; i < warps; ++i) amax = fmaxf(amax, warp_max[i]);
    scale = row_scale(max_all(amax));  // IEEE division (NVRTC's -prec-div=true)

    int sum = 0;
    for (int r0 = 0; r0 < units; r0 += per_round) {
#pragma unroll
        for (int i = 0; i < UNITS; ++i) {
            const int n = r0 + tid + i * nthreads;
            if (n >= units) continue;
            const int u = first + rotated(n, rot, units);
            if (units > per_round) load_unit(v[i], row, u);  // a long row: read again (from L2)
            out[u] = quantize_unit<BF16>(v[i], scale, sum);
        }
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
    if (lane == 0) warp_sum[warp] = sum;
    sync();
    total = 0;
    for (int i = 0; i < warps; ++i) total += warp_sum[i];
    total = sum_all(total);
    sync();  // warp_max and warp_sum are free for the next row
}

// Step 22's own quantisation kernel, one block a row of x: the row's bytes, its scale and the sum of
// its q. It lets the matmul launch at once (griddepcontrol): the weights need nothing from here.
template <bool BF16>
__global__ void __launch_bounds__(1024) quantize_x(const unsigned short *__restrict__ x, uint4 *__restrict__ xq,
                                                   float *__restrict__ x_scale, int *__restrict__ row_sum, int K,
                                                   int x_stride, int groups W2A8_TRACE_PARAM) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#if W2A8_TIMELINE
    if (threadIdx.x == 0) W2A8_NOW(trace[120000]);
#endif
    float scale;
    int total;
    quantize_row<BF16, 4>(GlobalRow{x + (size_t)blockIdx.x * x_stride, K}, groups, RowShare(0, 1, groups),
                          xq + (size_t)blockIdx.x * groups * 16, threadIdx.x, blockDim.x, 0, [] { __syncthreads(); },
                          [](float a) { return a; }, [](int s) { return s; }, scale, total);
    if (threadIdx.x == 0) {
        row_sum[blockIdx.x] = total;
        x_scale[blockIdx.x] = scale;
#if W2A8_TIMELINE
        W2A8_NOW(trace[120001]);
#endif
    }
}

// c += a b for a 16 x 32 block of unsigned 8-bit codes and a 32 x 8 block of signed 8-bit x, in int32.
__device__ __forceinline__ void mma_u8s8(int *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc[p'] counts code p' four^p' times over (group_w2a8): exact shifts bring the four to one sum.
__device__ __forceinline__ int w2a8_sum(int a0, int a1, int a2, int a3) { return a0 + (a1 >> 2) + (a2 >> 4) + (a3 >> 6); }

// z from a row's sum of x_q (w + 1): sum_k x_k (w_k + 1) - sum_k x_k, exact in int32 and in float (< 2^24),
// over the scales of the row of x and of the weights.
__device__ __forceinline__ float w2a8_z(int sum, int x_sum, float x_scale, float w_scale) {
    return (float)(sum - x_sum) / (x_scale * w_scale);
}

// One group (256 weights a row) of RT row tiles against MT tiles of 8 x rows. a[r][h] holds words
// 4 t .. 4 t + 3 of row 8 h + g of tile r (step 15's load); xv[j][p'] holds thread t's B registers of
// x row 8 j + g for code p'. Step (p', q): A = code p' of words 4 t + 2 q (columns 4 t ..) and
// 4 t + 2 q + 1 (columns 16 + 4 t ..) of rows g and g + 8; B = registers 2 q and 2 q + 1 of xv[j][p'].
template <int MT, int RT>
__device__ __forceinline__ void group_w2a8(int (&acc)[4][RT][MT][4], const uint4 (&a)[RT][2],
                                           const uint4 (&xv)[MT][4]) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const u32 mask = 0x03030303u << (2 * p);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const u32 a0 = part(a[r][0], 2 * q) & mask, a1 = part(a[r][1], 2 * q) & mask;
                const u32 a2 = part(a[r][0], 2 * q + 1) & mask, a3 = part(a[r][1], 2 * q + 1) & mask;
#pragma unroll
                for (int j = 0; j < MT; ++j)
                    mma_u8s8(acc[p][r][j], a0, a1, a2, a3, part(xv[j][p], 2 * q), part(xv[j][p], 2 * q + 1));
            }
        }
}

// Rows m0 .. m0 + x_rows - 1 of int8 x (xq, in quantize_x's order: rows of `groups` x 16 units), groups
// g_begin .. g_end - 1, into shared memory (row r from xs + r * xs_stride), from L2 (another kernel's or
// block's bytes): 4 loads in flight a thread, each block from its own unit `rot` on (see rotated).
__device__ __forceinline__ void load_xq_slice(uint4 *xs, const uint4 *xq, int m0, int x_rows, int groups, int g_begin,
                                              int g_end, int xs_stride, int rot, int tid, int nthreads) {
    const int units = (g_end - g_begin) * 16;
    const uint4 *slice = xq + ((size_t)m0 * groups + g_begin) * 16;  // row r: slice + r * groups * 16
    for (int i0 = tid; i0 < x_rows * units; i0 += 4 * nthreads) {
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int idx = i0 + i * nthreads;
            if (idx < x_rows * units)
                v[i] = __ldcg(slice + (size_t)(idx / units) * groups * 16 + rotated(idx % units, rot, units));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int idx = i0 + i * nthreads;
            if (idx < x_rows * units) xs[(idx / units) * xs_stride + rotated(idx % units, rot, units)] = v[i];
        }
    }
}

// Probes (compiled with -DW2A8_PROBE=...), as step 21's (PROBE_* in ternary_common.cuh).
#ifndef W2A8_PROBE
#define W2A8_PROBE PROBE_NONE
#endif

// Where w2a8_kernel quantises x (step 22: QUANT_SEPARATE; step 23: the others), its QUANT (Quant in w2a8.py, the same numbers; the comment below says how).
enum Quant { QUANT_SEPARATE = 0, QUANT_EVERY_BLOCK = 1, QUANT_STAGED = 2 };

// z[m, n] = (sum_k xq[m, k] W[n, k]) / (x_scale[m] scale[n * scale_stride]), xq from quantize_x (its
// order, rows of `groups` x 256 bytes), W in the "2bit_tiles" format. Blocks, warps, stages and the
// split of K as step 21 (tma_kernel <<<(row tiles / RT, K slices, M blocks), 32 (warps + 1)>>>);
// split K leaves int32 partial sums in `partials`. Dynamic shared memory: RING_BARRIER_BYTES, STAGES
// stages of warps x RT x CHUNK groups (1 KiB each), then x (x rows of groups_per_slice x 256 bytes
// + 64 of padding, so that the 8 lanes of a quarter warp reading 2 rows hit 8 different banks).
//
// Except in QUANT_STAGED, the producer only streams weights and the consumers load the block's x themselves
// (a copy of x by the engine would queue behind the first stages of weights). Where x is quantised (QUANT):
//   QUANT_SEPARATE: before, by quantize_x (xq, x_scale and row_sum are its outputs); the consumers wait for it
//      (griddepcontrol.wait), then load their slice of xq;
//   QUANT_EVERY_BLOCK: in every block (at most 8 rows of x, all of K): the consumers quantise the block's
//      rows of x from global memory into shared memory while the first stage of weights arrives; the
//      producer asks for the others once x is read (X_READ below), so that x is not queued behind them;
//   QUANT_STAGED: as QUANT_EVERY_BLOCK, but the copy engine first brings the block's 16-bit rows of x (K & ~7
//      activations a row) into shared memory, then every chunk of weights with no pause, so the ring can be
//      as deep as shared memory allows. The int8 bytes overwrite the row they were read from (a row of int8
//      x, groups x 256 + 64 bytes, never reaches the next 16-bit row, groups x 512 bytes on; quantize_row
//      holds a whole row in registers before its first write: K at most 8 x 16 activations a thread).
// Below four tiles the launch bounds ask for two blocks an SM, which keeps ptxas to 96 registers a thread
// (w2a8_blocks_per_sm counts on it; a test checks it).
template <int QUANT, bool BF16, int MT, int RT, int STAGES, int CHUNK>
__global__ void __launch_bounds__(288, RT * MT >= 4 ? 1 : 2) w2a8_kernel(
    uint4 *__restrict__ xq, const unsigned short *__restrict__ x, const uint4 *__restrict__ w, float *__restrict__ z,
    const float *__restrict__ scale, float *__restrict__ x_scale, int *__restrict__ row_sum,
    int *__restrict__ partials, u32 *__restrict__ arrivals, int M, int N, int K, int groups, int x_stride,
    int scale_stride, int groups_per_slice W2A8_TRACE_PARAM) {
    constexpr bool STAGED = QUANT == QUANT_STAGED;
    constexpr bool FUSED = QUANT == QUANT_EVERY_BLOCK || STAGED;
    static_assert(QUANT == QUANT_SEPARATE || FUSED, "x is quantised before, in every block or staged");
    static_assert(QUANT == QUANT_SEPARATE || MT == 1, "quantising in the matmul takes at most 8 rows of x a block");
    __shared__ float row_scales[8];  // FUSED: the block's rows of x
    __shared__ int row_sums[8];
    extern __shared__ __align__(128) unsigned char smem[];
    const int warps = (blockDim.x >> 5) - 1, warp = threadIdx.x >> 5, nthreads = warps * 32;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.z * 8 * MT, x_rows = min(8 * MT, M - m0);
    const WeightRing<RT, STAGES, CHUNK> ring(smem, w, warps, N, groups, groups_per_slice);
    const int g_begin = ring.g_begin, g_end = ring.g_end, tile0 = ring.tile0;
    uint4 *xs = ring.after();
    const int chunks = ring.chunks();
    const int xs_stride = groups_per_slice * 16 + 4;  // pieces a row of x
    const auto consumers_sync = [warps] { consumer_barrier(warps); };
    u64 *x_full = ring.spare_barriers();  // STAGED: the block's rows of x are in shared memory

    if (W2A8_PROBE == PROBE_LAUNCH_ONLY) return;
    W2A8_START;
    if (threadIdx.x == 0) {
        ring.init(warps);
        if (STAGED) mbarrier_init(x_full, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == warps) {  // the producer (its lane 0): the weights, as in step 21
        const u64 policy = evict_first_policy();
        if (STAGED && lane == 0) {  // x first: row r of x at 16-byte piece r x 32 groups of xs
            const u32 bytes = (u32)(K & ~7) * 2u;
            if (bytes == 0) {
                mbarrier_arrive(x_full);  // K < 8: every activation comes from global memory
            } else {
                mbarrier_expect_bytes(x_full, bytes * x_rows);
                const u64 keep = evict_last_policy();  // every block reads it
                for (int r = 0; r < x_rows; ++r)
                    bulk_copy(xs + r * groups_per_slice * 32, x + (size_t)(m0 + r) * x_stride, bytes, x_full, keep);
            }
        }
        const int first =
            W2A8_PROBE == PROBE_ARITHMETIC_ONLY ? 0 : QUANT == QUANT_EVERY_BLOCK ? min(1, chunks) : chunks;
        for (int c = 0; lane == 0 && c < first; ++c) {
            ring.fill(c, policy);
            W2A8_AT(c < 24, 32 + c);
        }
        if constexpr (QUANT == QUANT_EVERY_BLOCK) {  // the rest once the consumers have read x (X_READ below)
            __syncwarp();
            asm volatile("bar.sync 2, %0;" ::"r"((warps + 1) * 32) : "memory");
            for (int c = first; lane == 0 && W2A8_PROBE != PROBE_ARITHMETIC_ONLY && c < chunks; ++c) {
                ring.fill(c, policy);
                W2A8_AT(c < 24, 32 + c);
            }
        }
        __syncwarp();
    } else {
        const int tid = threadIdx.x;
        if constexpr (FUSED) {  // quantize_x's work, for the block's rows, into shared memory
            if (STAGED) mbarrier_wait(x_full, 0);
            for (int row = 0; row < x_rows; ++row) {
                float sc;
                int total;
                uint4 *out = xs + row * xs_stride;
                const auto max_all = [&](float amax) {  // X_READ (QUANT_EVERY_BLOCK): the producer may go on
                    if (QUANT == QUANT_EVERY_BLOCK && row == 0)
                        asm volatile("bar.arrive 2, %0;" ::"r"((warps + 1) * 32) : "memory");
                    W2A8_AT(row == 0 && tid == 0, 56);
                    return amax;
                };
                const auto sum_all = [](int sum) { return sum; };  // the row's sum of q is the block's
                const unsigned short *x_row = x + (size_t)(m0 + row) * x_stride;
                const auto quantize = [&](const auto &from) {
                    quantize_row<BF16, 8>(from, groups, RowShare(0, 1, groups), out, tid, nthreads, blockIdx.x,
                                          consumers_sync, max_all, sum_all, sc, total);
                };
                if constexpr (STAGED)
                    quantize(StagedRow{xs + row * groups_per_slice * 32, x_row, K});  // (all of K: the slice)
                else
                    quantize(GlobalRow{x_row, K});
                if (tid == 0) {
                    row_scales[row] = sc;
                    row_sums[row] = total;
                }
            }
        } else {
            const int rot = (blockIdx.x % (g_end - g_begin)) * 16;  // the unit of x this block reads first
            asm volatile("griddepcontrol.wait;" ::: "memory");  // quantize_x's xq, x_scale and row_sum
            load_xq_slice(xs, xq, m0, x_rows, groups, g_begin, g_end, xs_stride, rot, tid, nthreads);
        }
        consumer_barrier(warps);
        W2A8_AT(tid == 0, 1);
        int acc[4][RT][MT][4] = {};
        for (int c = 0; c < chunks; ++c) {
            uint4 a[CHUNK][RT][2];
            const int gc = ring.group(c, warp);
            const int ng = ring.take(c, warp, lane, a, W2A8_PROBE != PROBE_ARITHMETIC_ONLY);
            W2A8_AT(threadIdx.x == 0 && c < 24, 4 + c);
            if (W2A8_PROBE == PROBE_COPIES_ONLY) {
#pragma unroll
                for (int cg = 0; cg < CHUNK; ++cg)
                    if (cg < ng) acc[0][0][0][0] ^= (int)(a[cg][0][0].x & a[cg][RT - 1][1].w & 0x80000000u);
                continue;
            }
#pragma unroll
            for (int cg = 0; cg < CHUNK; ++cg)
                if (cg < ng) {
                    uint4 xv[MT][4];
                    const int gl = gc + cg - g_begin;
#pragma unroll
                    for (int j = 0; j < MT; ++j)
#pragma unroll
                        for (int p = 0; p < 4; ++p)
                            xv[j][p] = xs[min(8 * j + g, x_rows - 1) * xs_stride + gl * 16 + 4 * p + t];
                    group_w2a8<MT, RT>(acc, a[cg], xv);
                }
        }

        W2A8_AT(threadIdx.x == 0, 2);
        add_warp_sums<RT, MT>(reinterpret_cast<int *>(ring.stages), warps, x_rows,
                              [&](int r, int j, int c) {
                                  return w2a8_sum(acc[0][r][j][c], acc[1][r][j][c], acc[2][r][j][c], acc[3][r][j][c]);
                              },
                              [&](int row, int col, int sum) {
                                  const int n = tile0 * 16 + row, m = m0 + col;
                                  if (n >= N) return;
                                  if (gridDim.y > 1) {
                                      partials[((size_t)blockIdx.y * M + m) * N + n] = sum;
                                  } else {  // (row_sum, x_scale: quantize_x's)
                                      const int xsum = FUSED ? row_sums[col] : __ldcg(&row_sum[m]);
                                      const float xsc = FUSED ? row_scales[col] : __ldcg(&x_scale[m]);
                                      z[(size_t)m * N + n] = w2a8_z(sum, xsum, xsc, scale[(size_t)n * scale_stride]);
                                  }
                              });
    }
    W2A8_END;
    if (!FUSED && gridDim.y > 1) {
        asm volatile("griddepcontrol.wait;" ::: "memory");  // every thread that may read row_sum and x_scale
        finish_split_with(arrivals, blockIdx.z * gridDim.x + blockIdx.x, gridDim.y, partials, M, N, tile0 * 16, 16 * RT,
                          m0, x_rows, [&](int m, int n, int sum) {
                              z[(size_t)m * N + n] =
                                  w2a8_z(sum, __ldcg(&row_sum[m]), __ldcg(&x_scale[m]), scale[(size_t)n * scale_stride]);
                          });
    }
}

// Steps 24 and 25: several rows of x (up to 16 a block). Step 23's warps share a block's K, so every block needs its
// rows of x over all of its K (16 rows of K = 14336 are more than shared memory). Here the warps share the
// rows instead: consumer warp w owns TILES tiles of the block's WARPS x TILES, a block covers 16 WARPS TILES
// weight rows over a slice of K (grid.y), and its x is that slice only. Each warp sums its own tiles: no sums
// across warps, only across the slices of K (finish_split_with). A stage of the ring holds CHUNK groups of
// each tile. x comes from quantize_x (the matmul launched early) in step 23's order, so the arithmetic is
// group_w2a8. Step 24 (X_TMA = false): the consumer warps load the block's slice of x themselves, as step 22
// does (load_xq_slice), then meet at a barrier. Step 25 (X_TMA): a second producer thread has the copy engine
// bring it once quantize_x is done (the consumers' own loads would queue in L2 behind the weights); the same
// bytes in the same places, so both steps give the same bits.
template <int MT, int WARPS, int TILES, int STAGES, int CHUNK, bool X_TMA>
__global__ void __launch_bounds__(32 * (WARPS + 1), 1) w2a8_tiles_kernel(
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
        } else {  // step 22's loads: the consumers bring the block's slice of x themselves
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
        // the warp's TILES tiles, from weight row 16 (tile0 + warp TILES): z, or the partial sums of the block's slice
        for_each_output<MT, TILES>((ring.tile0 + warp * TILES) * 16, m0, g, t, M, N,
                                   [&](int i, int j, int c, int n, int m) {
            const int sum = w2a8_sum(acc[0][i][j][c], acc[1][i][j][c], acc[2][i][j][c], acc[3][i][j][c]);
            if (gridDim.y > 1)
                partials[((size_t)blockIdx.y * M + m) * N + n] = sum;
            else
                z[(size_t)m * N + n] =
                    w2a8_z(sum, __ldcg(&row_sum[m]), __ldcg(&x_scale[m]), scale[(size_t)n * scale_stride]);
        });
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
