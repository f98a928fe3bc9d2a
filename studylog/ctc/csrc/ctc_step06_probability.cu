// CTC loss and gradient in probability space: step 6 of chapter 4. Layouts: ctc_step01_baseline.cu.

#include "ctc_common.cuh"   // NEG_INF_D, warp_sum
#include "ctc_warpctc.cuh"  // fill_frames, slot_sum
#include "ctc_blocked.cuh"  // position<VT, BLOCKED>, thread_labels

// Step 6: step 5 with products and sums in place of log_plus, each row divided by the previous row's sum
// (Graves). A probability below float's normal range relative to the row's sum keeps a few bits, or becomes 0
// and stays 0, and the rescaling hides it. So the kernels also estimate, per utterance, the relative error of P
// that underflow can have caused (error_estimate[n]):
//   - the alpha kernel stores a reached value that underflowed to 0 as -0.0f (a positive subnormal already
//     says so), so the beta kernel knows which entries lost their precision;
//   - an entry stored below FLT_MIN is off by at most UNDERFLOW_ULP in its row's units. P is linear in every
//     alpha_t(s) and beta_t(s), with sum_s alpha_t(s) beta_t(s) / y_t(s) = P at every frame, so such an error
//     moves P by UNDERFLOW_ULP * beta_t(s) / y_t(s) (alpha's) or UNDERFLOW_ULP * alpha_t(s) / y_t(s) (beta's),
//     relative to the frame's total, and an underflowing posterior alpha beta / y by UNDERFLOW_ULP / y_t(s);
//   - the beta kernel adds these up over the frames (first order): +inf where a frame's total is 0, an
//     emission is below FLT_MIN, or the loss is infinite. Exact zeros of unreachable positions add nothing.
#define FLT_MIN_NORMAL 1.17549435e-38f  // FLT_MIN: smallest normal float
#define UNDERFLOW_ULP 0x1p-148            // 2 x 2^-149: the largest error of a value stored below FLT_MIN

template <int VT, bool BLOCKED>
__global__ void ctc_alpha_step6(ALPHA_PARAMS(probs)) {
    extern __shared__ float rows[];  // [2][Smax]: row t - 1 and row t
    const auto [n, Tn, S, Smax, warp, lane, nwarps] = utterance<true>(input_lengths, target_lengths, Lmax);
    __shared__ float warp_sums[2][32];
    int label[VT];
    bool skip[VT];  // position s may also be reached from s - 2
    thread_labels<VT, BLOCKED, false>(labels, n, Lmax, S, label, skip);
    float* a = alphas + (size_t)n * T * Smax;
    double shift = 0.0;       // alpha_t(s) = a[t][s] * exp(shift)
    float prev_scale = 1.0f;  // 1 / (sum of row t - 1), applied while reading it
    for (int t = 0; t < Tn; ++t) {
        if (t > 0) {
            float total = 0.0f;
            for (int w = 0; w < nwarps; ++w) total += warp_sums[(t - 1) & 1][w];
            prev_scale = total > 0.0f ? 1.0f / total : 1.0f;
            if (total > 0.0f) shift += log((double)total);
        }
        const float* y = probs + ((size_t)t * N + n) * A;
        const float* prev = rows + ((t + 1) & 1) * Smax;  // row t - 1
        float* cur = rows + (t & 1) * Smax;
        float local_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < VT; ++i) {
            const int s = position<VT, BLOCKED>(i);
            if (s < S) {
                float v;
                bool reached;  // some path arrives here: the entry should be positive
                if (t == 0) {
                    v = (s <= 1) ? 1.0f : 0.0f;
                    reached = s <= 1;
                } else {
                    v = prev[s];
                    if (s >= 1) v += prev[s - 1];
                    if (skip[i]) v += prev[s - 2];
                    reached = v > 0.0f;
                    v *= prev_scale;
                }
                v *= __ldg(y + label[i]);
                cur[s] = v;
                a[(size_t)t * Smax + s] = (reached && v == 0.0f) ? -0.0f : v;  // -0: underflowed to 0
                local_sum += v;
            }
        }
        local_sum = warp_sum(local_sum);
        if (lane == 0) warp_sums[t & 1][warp] = local_sum;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float* last = rows + ((Tn - 1) & 1) * Smax;
        float tail = last[S - 1];
        if (S > 1) tail += last[S - 2];
        log_likelihood[n] = tail > 0.0f ? log((double)tail) + shift : NEG_INF_D;
    }
}

template <int VT, bool BLOCKED>
__global__ void ctc_beta_grad_step6(BETA_POINTERS(probs), float* __restrict__ error_estimate, BETA_SIZES) {
    extern __shared__ float shared[];  // beta rows [2][Smax], then the posterior of each position [Smax]
    __shared__ float warp_sums[2][32];
    __shared__ float warp_total[32], warp_blank[32], warp_lost[32];
    const auto [n, Tn, S, Smax, warp, lane, nwarps] = utterance<true>(input_lengths, target_lengths, Lmax);
    float* post = shared + 2 * Smax;
    const double ll = __ldg(log_likelihood + n);
    const bool infinite = ll == NEG_INF_D;
    if (threadIdx.x == 0) loss[n] = (infinite && zero_infinity) ? 0.0f : (float)(-ll);
    if (threadIdx.x == 0 && infinite) error_estimate[n] = __int_as_float(0x7f800000);  // nothing to vouch for
    fill_frames(grad, 0.0f, Tn, T, n, N, A);  // frames past the input length do not touch the loss
    if (infinite) {  // no alignment: the gradient is undefined (NaN), or zero with zero_infinity
        fill_frames(grad, zero_infinity ? 0.0f : __int_as_float(0x7fc00000), 0, Tn, n, N, A);
        return;
    }
    int label[VT];
    bool skip[VT];  // position s may also go on to s + 2
    thread_labels<VT, BLOCKED, true>(labels, n, Lmax, S, label, skip);
    const float* a = alphas + (size_t)n * T * Smax;
    const int U = __ldg(num_slots + n);
    float next_scale = 1.0f;  // 1 / (sum of row t + 1), applied while reading it
    double estimate = 0.0;    // relative error of P that underflow may have caused (every thread's copy)
    for (int t = Tn - 1; t >= 0; --t) {
        if (t < Tn - 1) {
            float sum = 0.0f;
            for (int w = 0; w < nwarps; ++w) sum += warp_sums[(t + 1) & 1][w];
            next_scale = sum > 0.0f ? 1.0f / sum : 1.0f;
        }
        const float* y = probs + ((size_t)t * N + n) * A;
        float* g = grad + ((size_t)t * N + n) * A;
        float* cur = shared + (t & 1) * Smax;
        const float* nxt = shared + ((t + 1) & 1) * Smax;
        float local_sum = 0.0f, total = 0.0f, blank = 0.0f, lost = 0.0f;
#pragma unroll
        for (int i = 0; i < VT; ++i) {
            const int s = position<VT, BLOCKED>(i);
            if (s < S) {
                const float e = __ldg(y + label[i]);
                float v;
                bool reached;
                if (t == Tn - 1) {
                    v = (s >= S - 2) ? 1.0f : 0.0f;
                    reached = s >= S - 2;
                } else {
                    v = nxt[s];
                    if (s + 1 < S) v += nxt[s + 1];
                    if (skip[i]) v += nxt[s + 2];
                    reached = v > 0.0f;
                    v *= next_scale;
                }
                v *= e;
                cur[s] = v;
                local_sum += v;
                const float av = __ldg(a + (size_t)t * Smax + s);
                const float p = e > 0.0f ? av * v / e : 0.0f;  // alpha beta / y
                post[s] = p;
                total += p;
                if (!(s & 1)) blank += p;
                // what underflow may have cost here, in units of this frame's total (see above)
                if (e < FLT_MIN_NORMAL) {
                    lost = __int_as_float(0x7f800000);  // y itself lost its precision
                } else {
                    const bool alpha_lost = __float_as_uint(av) == 0x80000000u || (av > 0.0f && av < FLT_MIN_NORMAL);
                    if (alpha_lost) lost += v / e;
                    if (reached && v < FLT_MIN_NORMAL && av > 0.0f) lost += av / e;
                    if (av > 0.0f && v > 0.0f && av * v < FLT_MIN_NORMAL) lost += 1.0f / e;
                }
            }
        }
        local_sum = warp_sum(local_sum);
        total = warp_sum(total);
        blank = warp_sum(blank);
        lost = warp_sum(lost);
        if (lane == 0) {
            warp_sums[t & 1][warp] = local_sum;
            warp_total[warp] = total;
            warp_blank[warp] = blank;
            warp_lost[warp] = lost;
        }
        for (int k = threadIdx.x; k < A; k += blockDim.x) g[k] = __ldg(y + k);
        __syncthreads();  // the softmax of the frame is written before the labels' entries are fixed
        total = 0.0f;
        lost = 0.0f;
        for (int w = 0; w < nwarps; ++w) {
            total += warp_total[w];
            lost += warp_lost[w];
        }
        estimate += total > 0.0f ? (double)lost * UNDERFLOW_ULP / (double)total : (double)__int_as_float(0x7f800000);
        if (t == 0 && threadIdx.x == 0) error_estimate[n] = (float)estimate;
        const float inv_total = 1.0f / total;  // inf (a NaN gradient) if every alignment underflowed
        for (int u = threadIdx.x; u < U; u += blockDim.x) {
            const int cls = __ldg(slot_class + n * Umax + u);
            const float sum = slot_sum<true>(post, warp_blank, nwarps, slot_start, slot_members, n, u, Umax, Lmax);
            g[cls] = __ldg(y + cls) - sum * inv_total;
        }
        __syncthreads();  // post and the per-warp sums are rewritten by the next frame
    }
}
