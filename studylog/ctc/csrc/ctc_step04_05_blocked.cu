// CTC loss and gradient, warp-ctc style with register blocking: steps 4 and 5 of chapter 4, templates on the
// grain size VT (positions per thread) and the layout of a thread's positions. Layouts: ctc_step01_baseline.cu.

#include "ctc_common.cuh"   // NEG_INF, NEG_INF_D, log_plus, row_max
#include "ctc_warpctc.cuh"  // the pieces of steps 1 to 6 that no step changes
#include "ctc_blocked.cuh"  // position<VT, BLOCKED>, thread_labels

// Step 4: each thread owns VT positions for the whole utterance, their labels and skip flags in registers, and
// the VT updates of a frame are independent instructions. Layout of a thread's positions: ctc_blocked.cuh.
template <int VT, bool BLOCKED>
__global__ void ctc_alpha_step4(ALPHA_PARAMS(log_probs)) {
    const auto [n, Tn, S, Smax, warp, lane, nwarps] = utterance<true>(input_lengths, target_lengths, Lmax);
    __shared__ float warp_maxima[2][32];
    int label[VT];
    bool skip[VT];  // position s may also be reached from s - 2
    thread_labels<VT, BLOCKED, false>(labels, n, Lmax, S, label, skip);
    float* a = alphas + (size_t)n * T * Smax;
    double shift = 0.0;       // log alpha_t(s) = a[t][s] + shift
    float prev_max = 0.0f;    // maximum of row t - 1, subtracted while reading it
    for (int t = 0; t < Tn; ++t) {
        if (t > 0) {
            prev_max = row_max(warp_maxima[(t - 1) & 1], nwarps);
            shift += prev_max;
        }
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        const float* prev = a + (size_t)(t > 0 ? t - 1 : 0) * Smax;
        float local_max = NEG_INF;
#pragma unroll
        for (int i = 0; i < VT; ++i) {
            const int s = position<VT, BLOCKED>(i);
            if (s < S) {
                float v;
                if (t == 0) {
                    v = (s <= 1) ? 0.0f : NEG_INF;
                } else {
                    v = prev[s] - prev_max;
                    if (s >= 1) v = log_plus(v, prev[s - 1] - prev_max);
                    if (skip[i]) v = log_plus(v, prev[s - 2] - prev_max);
                }
                v += __ldg(lp + label[i]);
                a[(size_t)t * Smax + s] = v;
                local_max = fmaxf(local_max, v);
            }
        }
        publish_row_max(local_max, warp_maxima[t & 1], warp, lane);
        __syncthreads();
    }
    if (threadIdx.x == 0) log_likelihood[n] = log_likelihood_of(a + (size_t)(Tn - 1) * Smax, S, shift);
}

template <int VT, bool BLOCKED>
__global__ void ctc_beta_grad_step4(BETA_POINTERS(log_probs), BETA_SIZES) {
    extern __shared__ float shared[];  // beta rows [2][Smax], then the posterior of each position [Smax]
    __shared__ float warp_maxima[2][32];
    __shared__ float warp_top[32], warp_total[32], warp_blank[32];
    const auto [n, Tn, S, Smax, warp, lane, nwarps] = utterance<true>(input_lengths, target_lengths, Lmax);
    float* post = shared + 2 * Smax;
    if (no_alignment(__ldg(log_likelihood + n), loss, grad, zero_infinity, Tn, T, n, N, A)) return;
    int label[VT];
    bool skip[VT];  // position s may also go on to s + 2
    thread_labels<VT, BLOCKED, true>(labels, n, Lmax, S, label, skip);
    const float* a = alphas + (size_t)n * T * Smax;
    const int U = __ldg(num_slots + n);
    float next_max = 0.0f;    // maximum of row t + 1, subtracted while reading it
    for (int t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) next_max = row_max(warp_maxima[(t + 1) & 1], nwarps);
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        float* g = grad + ((size_t)t * N + n) * A;
        float* cur = shared + (t & 1) * Smax;
        const float* nxt = shared + ((t + 1) & 1) * Smax;
        float local_max = NEG_INF, top = NEG_INF;
#pragma unroll
        for (int i = 0; i < VT; ++i) {
            const int s = position<VT, BLOCKED>(i);
            if (s < S) {
                const float e = __ldg(lp + label[i]);
                float v;
                if (t == Tn - 1) {
                    v = (s >= S - 2) ? 0.0f : NEG_INF;
                } else {
                    v = nxt[s] - next_max;
                    if (s + 1 < S) v = log_plus(v, nxt[s + 1] - next_max);
                    if (skip[i]) v = log_plus(v, nxt[s + 2] - next_max);
                }
                v += e;
                cur[s] = v;
                local_max = fmaxf(local_max, v);
                post[s] = __ldg(a + (size_t)t * Smax + s) + v - e;  // log of alpha beta / y, up to the offsets
                top = fmaxf(top, post[s]);
            }
        }
        top = frame_top(local_max, top, warp_maxima[t & 1], warp_top);
        float total = 0.0f, blank = 0.0f;
#pragma unroll
        for (int i = 0; i < VT; ++i) {
            const int s = position<VT, BLOCKED>(i);
            if (s < S) normalise_posterior(post, s, top, total, blank);
        }
        frame_gradient<true>(g, lp, post, total, blank, warp_total, warp_blank, slot_class, slot_start, slot_members, n,
                             U, Umax, Lmax, A, warp, lane, nwarps);
    }
}

// Step 5: the alpha kernel keeps the two live rows in shared memory; each row still goes to global memory,
// write-only, for the gradient. (The beta kernel already worked this way: step 5 uses ctc_beta_grad_step4.)
template <int VT, bool BLOCKED>
__global__ void ctc_alpha_step5(ALPHA_PARAMS(log_probs)) {
    extern __shared__ float rows[];  // [2][Smax]: row t - 1 and row t
    const auto [n, Tn, S, Smax, warp, lane, nwarps] = utterance<true>(input_lengths, target_lengths, Lmax);
    __shared__ float warp_maxima[2][32];
    int label[VT];
    bool skip[VT];  // position s may also be reached from s - 2
    thread_labels<VT, BLOCKED, false>(labels, n, Lmax, S, label, skip);
    float* a = alphas + (size_t)n * T * Smax;
    double shift = 0.0;       // log alpha_t(s) = a[t][s] + shift
    float prev_max = 0.0f;    // maximum of row t - 1, subtracted while reading it
    for (int t = 0; t < Tn; ++t) {
        if (t > 0) {
            prev_max = row_max(warp_maxima[(t - 1) & 1], nwarps);
            shift += prev_max;
        }
        const float* lp = log_probs + ((size_t)t * N + n) * A;
        const float* prev = rows + ((t + 1) & 1) * Smax;  // row t - 1
        float* cur = rows + (t & 1) * Smax;
        float local_max = NEG_INF;
#pragma unroll
        for (int i = 0; i < VT; ++i) {
            const int s = position<VT, BLOCKED>(i);
            if (s < S) {
                float v;
                if (t == 0) {
                    v = (s <= 1) ? 0.0f : NEG_INF;
                } else {
                    v = prev[s] - prev_max;
                    if (s >= 1) v = log_plus(v, prev[s - 1] - prev_max);
                    if (skip[i]) v = log_plus(v, prev[s - 2] - prev_max);
                }
                v += __ldg(lp + label[i]);
                cur[s] = v;
                a[(size_t)t * Smax + s] = v;
                local_max = fmaxf(local_max, v);
            }
        }
        publish_row_max(local_max, warp_maxima[t & 1], warp, lane);
        __syncthreads();
    }
    if (threadIdx.x == 0) log_likelihood[n] = log_likelihood_of(rows + ((Tn - 1) & 1) * Smax, S, shift);
}

// One instance compiled with the file itself, so that it has an entry without name expressions.
template __global__ void ctc_alpha_step4<1, false>(ALPHA_PARAMS(log_probs));
