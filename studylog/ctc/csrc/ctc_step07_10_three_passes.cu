// CTC loss and gradient, steps 7 to 10 of chapter 4: three passes, the gradient a pass of its own.
//   pass 1   a block per frame (t, n). Step 7 (ctc_log_softmax_frames): the frame's log-softmax, written whole as
//            steps 1 to 6 write it. Steps 8 to 12 (ctc_fused_stats): only the frame's log-sum-exp and the base-2
//            log-probabilities of the blank and the target's labels ("emissions", (N, T, Lmax + 1), entry 0 =
//            blank); the softmax is never written.
//   pass 2   the recursions, every row written with its offset: rows (2, N, T, stride), row_shift (2, N, T),
//            double. Steps 7 and 8 (ctc_block_recursion): a block per utterance at step 5's grain and block size,
//            rows in shared memory, a barrier per frame, alpha then beta. Step 9 (ctc_warp_recursion_in_turn): one
//            warp, rows in registers, neighbours by shuffles, alpha then beta. Step 10 (ctc_fused_recursion):
//            alpha's warp and beta's side by side.
//   pass 3   a block per frame (t, n): the posterior from the two rows, normalised over the frame, then
//            grad = softmax - posterior, from the log-softmax (step 7: ctc_grad_from_log_softmax) or from the
//            activations and the frame's log-sum-exp (steps 8 to 12: ctc_fused_grad).
// Traffic in T N A floats: steps 1 to 7 make four passes (the activations read, the log-softmax written and read
// back, the gradient written), steps 8 to 12 three (the activations read twice, the gradient written once).

#include "ctc_common.cuh"          // NEG_INF, FULL_MASK, slot_posterior
#include "ctc_fused.cuh"           // frame_lse, write_emissions, frame_posterior, loss_of_frame, write_softmax, ...
#include "ctc_warp_recursion.cuh"  // warp_recursion: the recursion on a warp per direction, but its update

// Pass 1 of step 7: the log-softmax of each frame, written out.
extern "C" __global__ void ctc_log_softmax_frames(const float* __restrict__ x, const int* __restrict__ input_lengths,
                                                  float* __restrict__ log_probs, int N, int A, int vectorised) {
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    if (t >= __ldg(input_lengths + n)) return;  // the whole block: this frame is past the input
    const float* xr = x + (size_t)row * A;
    const float lse = frame_lse(xr, A, vectorised, scratch);  // vectorised: A % 4 == 0 and x 16-byte aligned
    write_log_softmax(log_probs + (size_t)row * A, xr, A, vectorised, lse);
}

// Pass 1 of steps 8 to 12: log-sum-exp of each frame and the emissions of the target's labels.
extern "C" __global__ void ctc_fused_stats(
    const float* __restrict__ x, const int* __restrict__ labels, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, float* __restrict__ row_lse, float* __restrict__ emissions,
    int T, int N, int A, int Lmax, int vectorised) {
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    if (t >= __ldg(input_lengths + n)) return;  // the whole block: this frame is past the input
    const float* xr = x + (size_t)row * A;
    const float lse = frame_lse(xr, A, vectorised, scratch);  // vectorised: A % 4 == 0 and x 16-byte aligned
    if (threadIdx.x == 0) row_lse[row] = lse;
    const int L = __ldg(target_lengths + n);
    float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);
    write_emissions(em, xr, labels, n, Lmax, L, lse);
}

// Pass 2: the recursions. Base-2 log space: log2(2^a + 2^b [+ 2^c]).
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

// Steps 7 and 8: one direction for one utterance on a block of threads, as step 5's alpha kernel lays it out:
// thread tid owns the G positions s = tid + i blockDim.x; the old and new rows live in shared memory, and one
// barrier per frame orders the new row (and its warps' maxima) before any thread reads it. Each position takes
// the log-sum-exp of its predecessors in the old row, plus its emission, minus the old row's maximum.
#define MAX_SHARED_POSITIONS 1024  // S <= 2 MAX_TARGET_LENGTH + 1 = 1023

// Position s's emission of frame t (-inf where s does not exist). LOG_SOFTMAX (step 7): gathered from the
// log-softmax (T, N, A) the first pass wrote, at the blank or at label (s + 1) / 2's class, scaled to base 2.
// Otherwise (step 8): read from the emissions (N, T, Lmax + 1), which the first pass wrote instead.
template <bool LOG_SOFTMAX>
__device__ __forceinline__ float position_emission(const float* __restrict__ emissions, const int* __restrict__ lab,
                                                   int t, int n, int T, int N, int A, int Lmax, int s, bool exists) {
    if (!exists) return NEG_INF;
    if constexpr (LOG_SOFTMAX) {
        const int cls = (s & 1) ? __ldg(lab + (s >> 1)) : 0;
        return __fmul_rn(__ldg(emissions + ((size_t)t * N + n) * A + cls), LOG2E);
    } else {
        return __ldg(emissions + ((size_t)n * T + t) * (Lmax + 1) + ((s & 1) ? (s + 1) >> 1 : 0));
    }
}

// row[k & 1]: the row of the k-th frame computed; warp_maxima[k & 1][w]: warp w's maximum of that row. DEPTH: frames
// of emissions loaded ahead (PREFETCH in steps 7 and 8), or 0: a frame's emissions loaded by its own update.
template <int G, bool BACKWARD, bool LOG_SOFTMAX, int DEPTH>
__device__ __forceinline__ void block_direction_rows(float (&row)[2][MAX_SHARED_POSITIONS], float (&warp_maxima)[2][32],
                                                     RECURSION_PARAMS, int A) {
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

    constexpr int SLOTS = DEPTH > 0 ? DEPTH : 1;
    float e[SLOTS][G];  // each position's emission of the frame in each prefetch slot
    if constexpr (DEPTH > 0) {
#pragma unroll
        for (int p = 0; p < DEPTH; ++p) {
            const int t = BACKWARD ? Tn - 1 - p : p;
#pragma unroll
            for (int i = 0; i < G; ++i) {
                e[p][i] = position_emission<LOG_SOFTMAX>(emissions, lab, t, n, T, N, A, Lmax, tid + i * blockDim.x,
                                                         p < Tn && ((valid >> i) & 1));
            }
        }
    }
    __syncthreads();

    double shift = 0.0;
    for (int k0 = 0; k0 < Tn; k0 += SLOTS) {
#pragma unroll
        for (int p = 0; p < SLOTS; ++p) {
            const int k = k0 + p;
            if (k < Tn) {  // the same for the whole block
                const int t = BACKWARD ? Tn - 1 - k : k;
                const int b = k & 1;
                if constexpr (DEPTH == 0) {  // the frame's emissions, loaded when its update needs them
#pragma unroll
                    for (int i = 0; i < G; ++i) {
                        e[p][i] = position_emission<LOG_SOFTMAX>(emissions, lab, t, n, T, N, A, Lmax,
                                                                 tid + i * blockDim.x, (valid >> i) & 1);
                    }
                }
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
                const int kn = k + DEPTH;  // refill this slot with the frame DEPTH steps ahead
                if (DEPTH > 0 && kn < Tn) {
                    const int tn = BACKWARD ? Tn - 1 - kn : kn;
#pragma unroll
                    for (int i = 0; i < G; ++i) {
                        e[p][i] = position_emission<LOG_SOFTMAX>(emissions, lab, tn, n, T, N, A, Lmax,
                                                                 tid + i * blockDim.x, (valid >> i) & 1);
                    }
                }
                __syncthreads();  // the new row and its maxima are complete; the old row is no longer read
            }
        }
    }
}

// One direction with shared rows of its own, emissions prefetched PREFETCH frames ahead (block_direction) or DEPTH.
// Two wrappers of one body on purpose: block_direction keeps the shipped kernels' shared arrays under their old
// mangled names, so steps 7 and 8 compile to the same PTX as before the knobs; block_direction_at serves 7a and 7b.
template <int G, bool BACKWARD, bool LOG_SOFTMAX>
__device__ __forceinline__ void block_direction(RECURSION_PARAMS, int A) {
    __shared__ float row[2][MAX_SHARED_POSITIONS];
    __shared__ float warp_maxima[2][32];
    block_direction_rows<G, BACKWARD, LOG_SOFTMAX, PREFETCH>(row, warp_maxima, RECURSION_ARGS, A);
}

template <int G, bool BACKWARD, bool LOG_SOFTMAX, int DEPTH>
__device__ __forceinline__ void block_direction_at(RECURSION_PARAMS, int A) {
    __shared__ float row[2][MAX_SHARED_POSITIONS];
    __shared__ float warp_maxima[2][32];
    block_direction_rows<G, BACKWARD, LOG_SOFTMAX, DEPTH>(row, warp_maxima, RECURSION_ARGS, A);
}

// Steps 7 and 8: grid (N, 1), block 32 W threads (enough for S at G positions each): alpha, then beta. The two
// directions are two instantiations of block_direction, each with shared rows of its own, so beta's first
// writes cannot meet alpha's last reads. emissions: the log-softmax for step 7 (LOG_SOFTMAX), else the emissions.
template <int G, bool LOG_SOFTMAX>
__global__ void ctc_block_recursion(RECURSION_PARAMS, int A) {
    block_direction<G, false, LOG_SOFTMAX>(RECURSION_ARGS, A);
    block_direction<G, true, LOG_SOFTMAX>(RECURSION_ARGS, A);
}

// Step 7's recursion with two of its changes as knobs, to time them one at a time (studylog.ctc.fused: steps 7a
// and 7b). DIRECTIONS: 1 alpha, 2 beta, 3 alpha then beta in one kernel (ctc_block_recursion); DEPTH: frames of
// emissions prefetched (0: loaded when needed). <G, LOG_SOFTMAX, 3, PREFETCH> is ctc_block_recursion<G, LOG_SOFTMAX>.
template <int G, bool LOG_SOFTMAX, int DIRECTIONS, int DEPTH>
__global__ void ctc_block_recursion_knobs(RECURSION_PARAMS, int A) {
    if constexpr ((DIRECTIONS & 1) != 0) block_direction_at<G, false, LOG_SOFTMAX, DEPTH>(RECURSION_ARGS, A);
    if constexpr ((DIRECTIONS & 2) != 0) block_direction_at<G, true, LOG_SOFTMAX, DEPTH>(RECURSION_ARGS, A);
}

// The update of a frame: the lane's V positions from the old row r (prev_max: its maximum, subtracted), the
// neighbours across lanes from shuffles. eb, el: the frame's blank and the lane's H = V / 2 label emissions.
// warp_recursion (ctc_warp_recursion.cuh) runs it for every frame of each direction.
struct FrameUpdate {
    template <int V, bool BACKWARD>
    static __device__ __forceinline__ void frame(float (&r)[V], float eb, const float (&el)[V / 2], unsigned valid,
                                                 unsigned skip, float prev_max, int lane) {
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
                float e = (i & 1) ? el[i >> 1] : eb;
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
                float e = (i & 1) ? el[i >> 1] : eb;
                e = (valid >> i) & 1 ? e : NEG_INF;
                const float v = (i & 1) && ((skip >> i) & 1) ? lse3(r[i], x1, x2) : lse2(r[i], x1);
                r[i] = v + e - prev_max;
            }
        }
    }
};

// Step 9: grid (N, 1), block 32: one warp runs alpha, then beta (warp_recursion_direction).
template <int V>
__global__ void __launch_bounds__(32) ctc_warp_recursion_in_turn(RECURSION_PARAMS) {
    warp_recursion_direction<FrameUpdate, V, PREFETCH, false, false>(RECURSION_ARGS);
    warp_recursion_direction<FrameUpdate, V, PREFETCH, false, true>(RECURSION_ARGS);
}

// Step 10: grid (N, 2), block 32: alpha's warp and beta's side by side (warp_recursion).
template <int V>
__global__ void __launch_bounds__(32) ctc_fused_recursion(RECURSION_PARAMS) {
    warp_recursion<FrameUpdate, V, PREFETCH, false>(RECURSION_ARGS);
}

// Pass 3 of step 7: posterior of frame t and grad = softmax - posterior, from the log-softmax lp.
extern "C" __global__ void ctc_grad_from_log_softmax(
    const float* __restrict__ log_probs, const float* __restrict__ rows, const double* __restrict__ row_shift,
    const int* __restrict__ input_lengths, const int* __restrict__ target_lengths, const int* __restrict__ labels,
    const int* __restrict__ slot_class, const int* __restrict__ slot_start, const int* __restrict__ slot_members,
    const int* __restrict__ num_slots, float* __restrict__ grad, float* __restrict__ loss, int T, int N, int A,
    int Lmax, int Umax, int row_stride, int vectorised, int zero_infinity) {
    __shared__ float post[1024];  // posterior of each position of this frame (S <= 1023)
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    float* g = grad + (size_t)row * A;
    const float* lp = log_probs + (size_t)row * A;
    if (t >= __ldg(input_lengths + n)) {  // past the input: no gradient (the whole block)
        fill_frame(g, A, 0.0f);
        return;
    }
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const float* ra = rows + ((size_t)n * T + t) * row_stride;
    const float* rb = rows + ((size_t)(N + n) * T + t) * row_stride;

    float top;  // log2 of the frame's largest alpha beta / y, up to the rows' offsets
    const float2 sums = frame_posterior_lp(post, scratch, ra, rb, lp, labels + n * Lmax, S, top);
    if (no_alignment_in_frame(g, loss, top, sums.x, row_shift, t, n, T, N, A, zero_infinity)) return;
    const float inv_total = 1.0f / sums.x;
    write_softmax_lp(g, lp, A, vectorised);
    __syncthreads();  // the softmax is written before the target's classes are overwritten
    const int U = __ldg(num_slots + n);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = __ldg(slot_class + n * Umax + u);
        const float p = u == 0 ? sums.y : slot_posterior(post, slot_start, slot_members, n, u, Umax, Lmax);
        g[cls] = __expf(__ldg(lp + cls)) - p * inv_total;
    }
}

// Pass 3 of steps 8 to 12: posterior of frame t and grad = softmax - posterior, straight from the activations.
extern "C" __global__ void ctc_fused_grad(
    const float* __restrict__ x, const float* __restrict__ row_lse, const float* __restrict__ emissions,
    const float* __restrict__ rows, const double* __restrict__ row_shift, const int* __restrict__ input_lengths,
    const int* __restrict__ target_lengths, const int* __restrict__ slot_class, const int* __restrict__ slot_start,
    const int* __restrict__ slot_members, const int* __restrict__ num_slots, float* __restrict__ grad,
    float* __restrict__ loss, int T, int N, int A, int Lmax, int Umax, int row_stride, int vectorised,
    int zero_infinity) {
    __shared__ float post[1024];  // posterior of each position of this frame (S <= 1023)
    __shared__ float scratch[64];
    const int row = blockIdx.x;  // = t * N + n
    const int t = row / N, n = row - t * N;
    float* g = grad + (size_t)row * A;
    const float* xr = x + (size_t)row * A;
    if (t >= __ldg(input_lengths + n)) {  // past the input: no gradient (the whole block)
        fill_frame(g, A, 0.0f);
        return;
    }
    const int S = 2 * __ldg(target_lengths + n) + 1;
    const float* ra = rows + ((size_t)n * T + t) * row_stride;
    const float* rb = rows + ((size_t)(N + n) * T + t) * row_stride;
    const float* em = emissions + ((size_t)n * T + t) * (Lmax + 1);

    float top;  // log2 of the frame's largest alpha beta / y, up to the rows' offsets
    const float2 sums = frame_posterior(post, scratch, ra, rb, em, S, top);
    if (no_alignment_in_frame(g, loss, top, sums.x, row_shift, t, n, T, N, A, zero_infinity)) return;
    const float inv_total = 1.0f / sums.x;
    const float lse = __ldg(row_lse + row);
    write_softmax(g, xr, A, vectorised, lse);
    __syncthreads();  // the softmax is written before the target's classes are overwritten
    const int U = __ldg(num_slots + n);
    for (int u = threadIdx.x; u < U; u += blockDim.x) {
        const int cls = __ldg(slot_class + n * Umax + u);
        const float p = u == 0 ? sums.y : slot_posterior(post, slot_start, slot_members, n, u, Umax, Lmax);
        g[cls] = __expf(__ldg(xr + cls) - lse) - p * inv_total;
    }
}
