// Step 7 of chapter 4 with its changes as compile-time knobs, so that step 7 minus one change at a time
// compiles from one file (lab/ctc/step07_changes.py launches them). The kernels are a copy of
// studylog/ctc/csrc/ctc_step07_fused_softmax.cu (commit 6d38268) and include the library's headers; with
// every knob at step 7's value they compute what the library's step 7 computes, bit for bit.
//
//   SOFTMAX (change 1)   0: no softmax written: the first pass writes each frame's log-sum-exp and the
//                        base-2 emissions of the blank and the target's labels ((N, T, Lmax + 1)); the last
//                        pass recomputes the softmax from the activations (step 7).
//                        1: the first pass writes the whole (T, N, A) log-softmax (steps 1 to 6); the
//                        recursion gathers its emissions from it (at its labels' classes), the last
//                        pass reads it instead of the activations.
//   v7_recursion / v7_block_recursion (change 2)
//                        one warp per direction, V positions per lane, neighbours by shuffles (step 7), or
//                        a block of threads per direction, G positions per thread strided by the block, the
//                        two live rows in shared memory and one barrier per frame (step 5's way).
//   SIDE_BY_SIDE (change 3)
//                        true: grid (N, 2), alpha's warp (or block) and beta's side by side (step 7); false:
//                        grid (N, 1), one warp (or block) runs alpha, then beta.
//
// The three knobs compose: both recursions take SOFTMAX and SIDE_BY_SIDE, so all eight combinations compile
// (lab/ctc/step07_changes.py times a cumulative chain of them from the one with all three undone).
//
// Every variant does the same arithmetic in the same order as step 7 (the emissions are the same floats,
// the row maxima are exact, the log-sum-exps take their arguments in step 7's order), so each should match
// step 7 bit for bit; the structure, not the numbers, is what changes.
//
// Changes 4 (the gradient a pass of its own, a block per frame) and 5 (no alpha matrix read back in a frame
// loop) have no knob: the gradient inside beta's loop needs alpha finished first (so change 3 goes with it),
// and without that loop nothing reads the alpha matrix back in a frame loop (change 5 is change 4 seen
// from the alpha matrix). See lab/ctc/README.md.

#include "ctc_common.cuh"     // NEG_INF, FULL_MASK, warp_max, slot_posterior, row_max
#include "ctc_fused.cuh"      // frame_lse, write_emissions, frame_posterior, loss_of_frame, write_softmax, LOG2E
#include "ctc_recursion.cuh"  // frame_emissions, lane_max, store_row

#define SOFTMAX_NONE 0     // step 7: emissions only
#define SOFTMAX_WRITTEN 1  // the (T, N, A) log-softmax written and read back

// ------------------------------------------------------------------------------------------
// Pass 1: log-sum-exp of each frame, and the emissions (SOFTMAX_NONE) or the log-softmax (SOFTMAX_WRITTEN).
// ------------------------------------------------------------------------------------------
// The log-softmax x - lse of a frame (16-byte loads and stores when vectorised), what steps 1 to 6 write.
__device__ __forceinline__ void write_log_softmax(float* lp, const float* xr, int A, int vectorised, float lse) {
    if (vectorised) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* lp4 = reinterpret_cast<float4*>(lp);
        for (int k = threadIdx.x; k < (A >> 2); k += blockDim.x) {
            const float4 v = __ldg(x4 + k);
            lp4[k] = make_float4(v.x - lse, v.y - lse, v.z - lse, v.w - lse);
        }
    } else {
        for (int k = threadIdx.x; k < A; k += blockDim.x) lp[k] = __ldg(xr + k) - lse;
    }
}

template <int SOFTMAX>
__global__ void v7_stats(
    const float* __restrict__ x, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ row_lse, float* __restrict__ emissions,
    float* __restrict__ log_probs, int T, int N, int A, int Lmax, int vectorised) {
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    if (t >= __ldg(input_lengths + n)) return;  // the whole block: this frame is past the input
    const float* xr = x + (size_t)row * A;
    const float lse = frame_lse(xr, A, vectorised, scratch);  // vectorised: A % 4 == 0 and x 16-byte aligned
    if constexpr (SOFTMAX == SOFTMAX_WRITTEN) {
        write_log_softmax(log_probs + (size_t)row * A, xr, A, vectorised, lse);
    } else {
        if (threadIdx.x == 0) row_lse[row] = lse;
        const int L = __ldg(target_lengths + n);
        float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
        write_emissions(em, xr, labels, n, Lmax, L, lse);
    }
}

// ------------------------------------------------------------------------------------------
// Pass 2: the recursions. Base-2 log space: log2(2^a + 2^b [+ 2^c]).
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ float lse2(float a, float b) {
    const float m = fmaxf(a, b);
    const float r = m + __log2f(1.0f + exp2f(fminf(a, b) - m));
    return m == NEG_INF ? NEG_INF : r;
}

__device__ __forceinline__ float lse3(float a, float b, float c) {
    const float hi = fmaxf(a, b), lo = fminf(a, b);
    const float m = fmaxf(hi, c), mid = fminf(hi, c);
    const float r = m + __log2f(1.0f + exp2f(mid - m) + exp2f(lo - m));
    return m == NEG_INF ? NEG_INF : r;
}

// Frames prefetched ahead of the one being computed (hides the load latency of the emissions).
#define PREFETCH 4

// A lane's emissions of frame t: from the emissions array (SOFTMAX_NONE, as step 7), or gathered from the
// log-softmax row at the classes of the lane's H labels (SOFTMAX_WRITTEN: lab is the utterance's labels, read
// through the L1 cache), scaled to base 2 as the first pass scales them (a rounded product, never fused into
// the update's additions, so the emission is the float step 7 stores).
template <int H, int SOFTMAX>
__device__ __forceinline__ void lane_emissions(const float* em_base, const float* __restrict__ log_probs,
                                               const int* __restrict__ lab, int t, int n, int N, int A, int Lmax,
                                               int lane, int L, float& eb, float (&el)[H]) {
    if constexpr (SOFTMAX == SOFTMAX_WRITTEN) {
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        eb = __fmul_rn(__ldg(lp), LOG2E);
#pragma unroll
        for (int q = 0; q < H; ++q) {
            const int j = lane * H + q + 1;
            el[q] = j <= L ? __fmul_rn(__ldg(lp + __ldg(lab + j - 1)), LOG2E) : NEG_INF;
        }
    } else {
        frame_emissions<H>(em_base + (size_t)t * (Lmax + 1), lane, L, eb, el);
    }
}

// One direction for one utterance, one warp (step 7's warp_recursion_direction with its FrameUpdate).
// Lane l owns positions s = l V .. l V + V - 1 (V even, so position i of a lane is a blank for even i
// and label j = l V / 2 + (i + 1) / 2 for odd i).
template <int V, bool BACKWARD, int SOFTMAX>
__device__ __forceinline__ void warp_direction(
    const float* __restrict__ emissions, const float* __restrict__ log_probs, const int* __restrict__ labels,
    const int* __restrict__ input_lengths, const int* __restrict__ target_lengths, float* __restrict__ rows,
    double* __restrict__ row_shift, int T, int N, int A, int Lmax) {
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

    float eb[PREFETCH];       // blank emission of the frame in each prefetch slot
    float el[PREFETCH][H];    // the lane's label emissions
#pragma unroll
    for (int p = 0; p < PREFETCH; ++p) {
        const int t = BACKWARD ? Tn - 1 - p : p;
        eb[p] = NEG_INF;
#pragma unroll
        for (int q = 0; q < H; ++q) el[p][q] = NEG_INF;
        if (p < Tn) {
            lane_emissions<H, SOFTMAX>(em_base, log_probs, lab, t, n, N, A, Lmax, lane, L, eb[p], el[p]);
        }
    }

    double shift = 0.0;  // log2 alpha (or beta) of frame t = r + shift
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH) {
#pragma unroll
        for (int p = 0; p < PREFETCH; ++p) {
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
                        const float v = (i & 1) && ((skip >> i) & 1) ? lse3(r[i], x1, x2) : lse2(r[i], x1);
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
                        const float v = (i & 1) && ((skip >> i) & 1) ? lse3(r[i], x1, x2) : lse2(r[i], x1);
                        r[i] = v + e - prev_max;
                    }
                }
                shift += prev_max;
                if (s0 < S) store_row<V>(out_rows + (size_t)t * stride, r);
                if (lane == 0) out_shift[t] = shift;
                // refill this slot with the frame PREFETCH steps ahead
                const int kn = k + PREFETCH;
                if (kn < Tn) {
                    lane_emissions<H, SOFTMAX>(em_base, log_probs, lab, BACKWARD ? Tn - 1 - kn : kn, n, N, A, Lmax,
                                               lane, L, eb[p], el[p]);
                }
            }
        }
    }
}

// SIDE_BY_SIDE: grid (N, 2), block 32: blockIdx.y = 0 runs alpha forward in time, 1 runs beta backward.
// Otherwise grid (N, 1), block 32: the warp runs alpha, then beta.
template <int V, int SOFTMAX, bool SIDE_BY_SIDE>
__global__ void __launch_bounds__(32) v7_recursion(
    const float* __restrict__ emissions, const float* __restrict__ log_probs, const int* __restrict__ labels,
    const int* __restrict__ input_lengths, const int* __restrict__ target_lengths, float* __restrict__ rows,
    double* __restrict__ row_shift, int T, int N, int A, int Lmax) {
    if (SIDE_BY_SIDE && blockIdx.y != 0) {
        warp_direction<V, true, SOFTMAX>(emissions, log_probs, labels, input_lengths, target_lengths, rows,
                                         row_shift, T, N, A, Lmax);
        return;
    }
    warp_direction<V, false, SOFTMAX>(emissions, log_probs, labels, input_lengths, target_lengths, rows,
                                      row_shift, T, N, A, Lmax);
    if (!SIDE_BY_SIDE)
        warp_direction<V, true, SOFTMAX>(emissions, log_probs, labels, input_lengths, target_lengths, rows,
                                         row_shift, T, N, A, Lmax);
}

// One direction for one utterance, a block of threads (change 2 undone: step 5's way). Thread tid owns the G
// positions s = tid + i blockDim.x; the old and new rows live in shared memory, and one barrier per frame orders
// the new row (and its warps' maxima) before any thread reads it. The arithmetic is step 7's: each position's
// log-sum-exp of its predecessors in the old row (their order as the warp kernel takes them), plus the emission,
// minus the old row's maximum. Rows are written to global memory with stride blockDim.x G.
#define MAX_SHARED_POSITIONS 1024  // S <= 2 MAX_TARGET_LENGTH + 1 = 1023
// Position s's emission of frame t (NEG_INF where s does not exist): from the emissions array (SOFTMAX_NONE), or
// gathered from the log-softmax row at the blank or at label (s + 1) / 2's class (SOFTMAX_WRITTEN), scaled to base 2
// as lane_emissions scales it, so both give the float step 7 stores.
template <int SOFTMAX>
__device__ __forceinline__ float position_emission(const float* em_base, const float* __restrict__ log_probs,
                                                   const int* __restrict__ lab, int t, int n, int N, int A, int Lmax,
                                                   int s, bool exists) {
    if (!exists) return NEG_INF;
    if constexpr (SOFTMAX == SOFTMAX_WRITTEN) {
        const int cls = (s & 1) ? __ldg(lab + (s >> 1)) : 0;
        return __fmul_rn(__ldg(log_probs + ((size_t)t * N + n) * A + cls), LOG2E);
    } else {
        return __ldg(em_base + (size_t)t * (Lmax + 1) + ((s & 1) ? (s + 1) >> 1 : 0));
    }
}

template <int G, bool BACKWARD, int SOFTMAX>
__device__ __forceinline__ void block_direction(
    const float* __restrict__ emissions, const float* __restrict__ log_probs, const int* __restrict__ labels,
    const int* __restrict__ input_lengths, const int* __restrict__ target_lengths, float* __restrict__ rows,
    double* __restrict__ row_shift, int T, int N, int A, int Lmax) {
    __shared__ float row[2][MAX_SHARED_POSITIONS];  // row[k & 1]: the row of the k-th frame computed
    __shared__ float warp_maxima[2][32];             // [k & 1][w]: warp w's maximum of that row
    const int n = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
    const int Tn = __ldg(input_lengths + n);
    const int L = __ldg(target_lengths + n);
    const int S = 2 * L + 1;
    const int* lab = labels + n * Lmax;

    unsigned valid = 0, skip = 0;  // bit i: position tid + i blockDim.x exists / takes the s -/+ 2 transition
#pragma unroll
    for (int i = 0; i < G; ++i) {
        const int s = tid + i * blockDim.x;
        if (s < S) valid |= 1u << i;
        if ((s & 1) && s < S) {
            const int j = (s + 1) >> 1;
            const bool jump = BACKWARD ? (j + 1 <= L && __ldg(lab + j) != __ldg(lab + j - 1))
                                       : (j >= 2 && __ldg(lab + j - 1) != __ldg(lab + j - 2));
            if (jump) skip |= 1u << i;
        }
    }
    // the row before the first frame: one path of probability 1 (maximum 0), in row[1]
#pragma unroll
    for (int i = 0; i < G; ++i) {
        const int s = tid + i * blockDim.x;
        if (s < S) row[1][s] = (s == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;
    }
    if (tid < 32) warp_maxima[1][tid] = tid == 0 ? 0.0f : NEG_INF;

    const size_t stride = (size_t)blockDim.x * G;
    float* out_rows = rows + ((size_t)(BACKWARD ? N + n : n) * T) * stride;
    double* out_shift = row_shift + (size_t)(BACKWARD ? N + n : n) * T;
    const float* em_base = emissions + (size_t)n * T * (Lmax + 1);

    float e[PREFETCH][G];  // each position's emission of the frame in each prefetch slot
#pragma unroll
    for (int p = 0; p < PREFETCH; ++p) {
        const int t = BACKWARD ? Tn - 1 - p : p;
#pragma unroll
        for (int i = 0; i < G; ++i) {
            e[p][i] = position_emission<SOFTMAX>(em_base, log_probs, lab, t, n, N, A, Lmax, tid + i * blockDim.x,
                                                 p < Tn && ((valid >> i) & 1));
        }
    }
    __syncthreads();

    double shift = 0.0;
    for (int k0 = 0; k0 < Tn; k0 += PREFETCH) {
#pragma unroll
        for (int p = 0; p < PREFETCH; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole block
                const int t = BACKWARD ? Tn - 1 - k : k;
                const int b = k & 1;
                const float* prev = row[b ^ 1];
                const float prev_max = row_max(warp_maxima[b ^ 1], nwarps);  // 0 when the row is all -inf
                float local = NEG_INF;
#pragma unroll
                for (int i = 0; i < G; ++i) {
                    const int s = tid + i * blockDim.x;
                    if ((valid >> i) & 1) {
                        float x1, x2;
                        if (!BACKWARD) {
                            x1 = s >= 1 ? prev[s - 1] : NEG_INF;
                            x2 = s >= 2 ? prev[s - 2] : NEG_INF;
                        } else {
                            x1 = s + 1 < S ? prev[s + 1] : NEG_INF;
                            x2 = s + 2 < S ? prev[s + 2] : NEG_INF;
                        }
                        const float v = (s & 1) && ((skip >> i) & 1) ? lse3(prev[s], x1, x2) : lse2(prev[s], x1);
                        const float r = v + e[p][i] - prev_max;
                        row[b][s] = r;
                        out_rows[(size_t)t * stride + s] = r;
                        local = fmaxf(local, r);
                    }
                }
                shift += prev_max;
                if (tid == 0) out_shift[t] = shift;
                local = warp_max(local);
                if (lane == 0) warp_maxima[b][warp] = local;
                const int kn = k + PREFETCH;
                if (kn < Tn) {
                    const int tn = BACKWARD ? Tn - 1 - kn : kn;
#pragma unroll
                    for (int i = 0; i < G; ++i) {
                        e[p][i] = position_emission<SOFTMAX>(em_base, log_probs, lab, tn, n, N, A, Lmax,
                                                             tid + i * blockDim.x, (valid >> i) & 1);
                    }
                }
                __syncthreads();  // the new row and its maxima are complete; the old row is no longer read
            }
        }
    }
}

// Block 32 W threads (enough for S at G positions each). SIDE_BY_SIDE: grid (N, 2), blockIdx.y = 0 alpha, 1 beta.
// Otherwise grid (N, 1): the block runs alpha, then beta. The two directions are two instantiations of
// block_direction, each with shared rows of its own, so beta's first writes cannot meet alpha's last reads.
template <int G, int SOFTMAX, bool SIDE_BY_SIDE>
__global__ void v7_block_recursion(
    const float* __restrict__ emissions, const float* __restrict__ log_probs, const int* __restrict__ labels,
    const int* __restrict__ input_lengths, const int* __restrict__ target_lengths, float* __restrict__ rows,
    double* __restrict__ row_shift, int T, int N, int A, int Lmax) {
    if (SIDE_BY_SIDE && blockIdx.y != 0) {
        block_direction<G, true, SOFTMAX>(emissions, log_probs, labels, input_lengths, target_lengths, rows,
                                          row_shift, T, N, A, Lmax);
        return;
    }
    block_direction<G, false, SOFTMAX>(emissions, log_probs, labels, input_lengths, target_lengths, rows,
                                       row_shift, T, N, A, Lmax);
    if (!SIDE_BY_SIDE)
        block_direction<G, true, SOFTMAX>(emissions, log_probs, labels, input_lengths, target_lengths, rows,
                                          row_shift, T, N, A, Lmax);
}

// ------------------------------------------------------------------------------------------
// Pass 3: posterior of frame t and grad = softmax - posterior, from the activations and the frame's
// log-sum-exp (SOFTMAX_NONE, step 7) or from the log-softmax written by the first pass (SOFTMAX_WRITTEN).
// ------------------------------------------------------------------------------------------
// frame_posterior (ctc_fused.cuh) with the emissions read from the log-softmax row lp: the blank's for even s,
// label (s + 1) / 2's for odd s, scaled to base 2 as the first pass scales them (a rounded product: the float
// step 7 stores, not fused into the subtraction).
__device__ __forceinline__ float2 frame_posterior_lp(float* post, float* scratch, const float* ra, const float* rb,
                                                     const float* lp, const int* lab, int S, float& top) {
    float local = NEG_INF;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int cls = (s & 1) ? __ldg(lab + (s >> 1)) : 0;
        const float v = __ldg(ra + s) + __ldg(rb + s) - __fmul_rn(__ldg(lp + cls), LOG2E);
        post[s] = v;
        local = fmaxf(local, v);
    }
    top = block_max(local, scratch);  // also orders the writes to post
    float total = 0.0f, blank = 0.0f;
    if (top != NEG_INF) {
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const float p = exp2f(post[s] - top);
            post[s] = p;
            total += p;
            if (!(s & 1)) blank += p;
        }
    }
    return block_sum2(total, blank, scratch);  // orders the writes to post again
}

// The softmax exp(lp) of a frame's log-softmax lp, written to g (as write_softmax, from lp).
__device__ __forceinline__ void write_softmax_lp(float* g, const float* lp, int A, int vectorised) {
    if (vectorised) {
        const float4* l4 = reinterpret_cast<const float4*>(lp);
        float4* g4 = reinterpret_cast<float4*>(g);
        for (int k = threadIdx.x; k < (A >> 2); k += blockDim.x) {
            const float4 v = __ldg(l4 + k);
            g4[k] = make_float4(__expf(v.x), __expf(v.y), __expf(v.z), __expf(v.w));
        }
    } else {
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = __expf(__ldg(lp + k));
    }
}

template <int SOFTMAX>
__global__ void v7_grad(
    const float* __restrict__ x, const float* __restrict__ log_probs, const float* __restrict__ row_lse,
    const float* __restrict__ emissions, const float* __restrict__ rows, const double* __restrict__ row_shift,
    const int* __restrict__ input_lengths, const int* __restrict__ target_lengths, const int* __restrict__ labels,
    const int* __restrict__ slot_class, const int* __restrict__ slot_start, const int* __restrict__ slot_members,
    const int* __restrict__ num_slots, float* __restrict__ grad, float* __restrict__ loss, int T, int N, int A,
    int Lmax, int Umax, int row_stride, int vectorised, int zero_infinity) {
    __shared__ float post[1024];  // posterior of each position of this frame (S <= 1023)
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    float* g = grad + (size_t)row * A;
    const float* xr = x + (size_t)row * A;
    const float* lp = log_probs + (size_t)row * A;
    if (t >= __ldg(input_lengths + n)) {  // past the input: no gradient (the whole block)
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = 0.0f;
        return;
    }
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const float* ra = rows + ((size_t)n * T + t) * row_stride;
    const float* rb = rows + ((size_t)(N + n) * T + t) * row_stride;

    float top;  // log2 of the frame's largest alpha beta / y, up to the rows' offsets
    float2 sums;
    if constexpr (SOFTMAX == SOFTMAX_WRITTEN) {
        sums = frame_posterior_lp(post, scratch, ra, rb, lp, labels + n * Lmax, S, top);
    } else {
        const float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
        sums = frame_posterior(post, scratch, ra, rb, em, S, top);
    }
    const bool infinite = top == NEG_INF;  // no alignment passes through this frame: P = 0
    if (t == 0 && threadIdx.x == 0) loss[n] = loss_of_frame(top, sums.x, row_shift, t, n, T, N, zero_infinity);
    if (infinite) {  // no alignment: the gradient is undefined (NaN), or zero with zero_infinity
        const float fill = zero_infinity ? 0.0f : __int_as_float(0x7fc00000);
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = fill;
        return;
    }
    const float inv_total = 1.0f / sums.x;
    float lse = 0.0f;
    if constexpr (SOFTMAX == SOFTMAX_WRITTEN) {
        write_softmax_lp(g, lp, A, vectorised);
    } else {
        lse = __ldg(row_lse + row);
        write_softmax(g, xr, A, vectorised, lse);
    }
    __syncthreads();  // the softmax is written before the target's classes are overwritten
    const int U = __ldg(num_slots + n);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = __ldg(slot_class + n * Umax + u);
        const float p = u == 0 ? sums.y : slot_posterior(post, slot_start, slot_members, n, u, Umax, Lmax);
        const float y = SOFTMAX == SOFTMAX_WRITTEN ? __expf(__ldg(lp + cls)) : __expf(__ldg(xr + cls) - lse);
        g[cls] = y - p * inv_total;
    }
}
