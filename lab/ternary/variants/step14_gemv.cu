// A candidate step 14, measured and not kept (lab/ternary/README.md): W2A8 for one row of x without the tensor cores
// or a ring. Each warp owns R weight rows ("2bit_mma" words, row-major) and issues every load of them at its start,
// CH 16-byte loads a lane a row, before x is read; x is then loaded (every block reads all of it), quantised into
// shared memory in step 12's byte order (quantize_unit, row_scale: the same bytes as quantize_activations), and each
// 4 weights cost one AND (code << 2p', as step 12) and one dp4a (unsigned codes x signed x), 4 accumulators a row.
// The sums are exact int32 and the output step 12's w2a8_z, so it is bit-equal to step 12.
#include "ternary_w2a8.cu"

__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// w: 2bit_mma rows, `groups` groups of 16 words (4 uint4) each; z[n] float32.
template <bool BF16, int R, int CH, int WARPS, int UNITS>
__global__ void __launch_bounds__(WARPS * 32, 1) step14_w2a8_gemv_kernel(
    const unsigned short *__restrict__ x, const uint4 *__restrict__ w, float *__restrict__ z,
    const float *__restrict__ scale, int N, int K, int groups, int scale_stride) {
    extern __shared__ uint4 xs[];  // CH * 32 weight uint4s' worth of x: CH * 8 groups of 256 bytes
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * WARPS + warp) * R;
    const int row_u4 = groups * 4;
    // x first: its loads must not queue behind the weights' (the quantisation waits on them, the sums on it)
    const int units = groups * 16, nthreads = WARPS * 32, tid = threadIdx.x;
    const int rot = (blockIdx.x % groups) * 16;
    const GlobalRow row{x, K};
    uint4 v[UNITS][2];
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
        const int n = tid + i * nthreads;
        if (n < units) load_unit(v[i], row, rotated(n, rot, units));
    }
    uint4 wv[R][CH];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int j = c * 32 + lane;
            wv[r][c] = (row0 + r < N && j < row_u4) ? load_weights(w + (size_t)(row0 + r) * row_u4 + j)
                                                    : make_uint4(0, 0, 0, 0);
        }
    }
    // zeros past the row's groups, up to what the lanes read
    for (int u = units + tid; u < CH * 8 * 16; u += nthreads) xs[u] = make_uint4(0, 0, 0, 0);
    __shared__ float warp_max[WARPS];
    __shared__ int warp_sum[WARPS];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < UNITS; ++i)
        if (tid + i * nthreads < units) amax = fmaxf(amax, fmaxf(piece_absmax<BF16>(v[i][0]), piece_absmax<BF16>(v[i][1])));
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    amax = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) amax = fmaxf(amax, warp_max[i]);
    const float x_scale = row_scale(amax);
    int qsum = 0;
#pragma unroll
    for (int i = 0; i < UNITS; ++i) {
        const int n = tid + i * nthreads;
        if (n < units) xs[rotated(n, rot, units)] = quantize_unit<BF16>(v[i], x_scale, qsum);
    }
    for (int o = 16; o; o >>= 1) qsum += __shfl_xor_sync(~0u, qsum, o);
    if (lane == 0) warp_sum[warp] = qsum;
    __syncthreads();
    int x_sum = 0;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) x_sum += warp_sum[i];
    int acc[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int p = 0; p < 4; ++p) acc[r][p] = 0;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int j = c * 32 + lane;  // uint4 j of a row: group j / 4, words 4 (j % 4) .. + 3
        uint4 xv[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) xv[p] = xs[(j >> 2) * 16 + 4 * p + (j & 3)];
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 word = part(wv[r][c], i);
#pragma unroll
                for (int p = 0; p < 4; ++p) acc[r][p] = dp4a_us(word & (0x03030303u << (2 * p)), part(xv[p], i), acc[r][p]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int s = w2a8_sum(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
        if (lane == 0 && row0 + r < N) z[row0 + r] = w2a8_z(s, x_sum, x_scale, scale[(size_t)(row0 + r) * scale_stride]);
    }
}
