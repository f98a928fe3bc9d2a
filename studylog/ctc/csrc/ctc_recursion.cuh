// One direction of the recursion of steps 9 to 14 of chapter 4: what those steps share around the update of a
// frame. A lane (step 14: a thread) holds V consecutive positions of the extended target in registers.
#pragma once

#include "ctc_common.cuh"  // NEG_INF

// The arguments of the recursion kernels of steps 7 to 14, in the order studylog.ctc.fused passes them: the
// emissions (N, T, Lmax + 1; step 7's: the log-softmax, (T, N, A)), the labels and lengths, then what they write,
// the rows and the rows' offsets.
#define RECURSION_PARAMS                                                                                        \
    const float* __restrict__ emissions, const int* __restrict__ labels, const int* __restrict__ input_lengths, \
        const int* __restrict__ target_lengths, float* __restrict__ rows, double* __restrict__ row_shift, int T, \
        int N, int Lmax
#define RECURSION_ARGS emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, Lmax

// The V positions s0 = lane V .. s0 + V - 1 of a lane (step 14: a thread) in utterance n's target of L labels and
// S = 2 L + 1 positions (V even: s0 + i is a blank for even i). Bit i of valid: position s0 + i exists; of skip: it
// takes the s - 2 transition (BACKWARD: s + 2). r: the row before the first frame (alpha) or after the last (beta),
// one path of probability 1 at s = 0 (alpha) or s = S - 1 (beta). The bits are gathered in locals and copied out
// last: so the callers compile to the code they made when each held this loop itself.
template <int V, bool BACKWARD>
__device__ __forceinline__ void lane_positions(const int* labels, int n, int Lmax, int L, int lane, unsigned& valid,
                                               unsigned& skip, float (&r)[V]) {
    const int S = 2 * L + 1;
    const int s0 = lane * V;
    const int* lab = labels + n * Lmax;
    unsigned bits = 0, skips = 0;
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const int s = s0 + i;
        if (s < S) bits |= 1u << i;
        if ((i & 1) && s < S) {
            const int j = (s + 1) >> 1;  // 1-based label position; its label is lab[j - 1]
            const bool jump = BACKWARD ? (j + 1 <= L && __ldg(lab + j) != __ldg(lab + j - 1))
                                       : (j >= 2 && __ldg(lab + j - 1) != __ldg(lab + j - 2));
            if (jump) skips |= 1u << i;
        }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = (s0 + i == (BACKWARD ? S - 1 : 0)) ? 0.0f : NEG_INF;
    valid = bits;
    skip = skips;
}

// The emissions lane `lane` (step 14: thread) needs of one frame (e: the frame's Lmax + 1 emissions): the
// blank's, and those of its H labels lane H + 1 .. lane H + H (-inf past the target's L labels).
template <int H>
__device__ __forceinline__ void frame_emissions(const float* e, int lane, int L, float& eb, float (&el)[H]) {
    eb = __ldg(e);
#pragma unroll
    for (int q = 0; q < H; ++q) {
        const int j = lane * H + q + 1;
        el[q] = j <= L ? __ldg(e + j) : NEG_INF;
    }
}

// The largest of a lane's V values.
template <int V>
__device__ __forceinline__ float lane_max(const float (&r)[V]) {
    float local = r[0];
#pragma unroll
    for (int i = 1; i < V; ++i) local = fmaxf(local, r[i]);
    return local;
}

// A lane's V values of a row, written two at a time (8-byte stores: V is even and dst_row 8-byte aligned).
template <int V>
__device__ __forceinline__ void store_row(float* dst_row, const float (&r)[V]) {
    float2* dst = reinterpret_cast<float2*>(dst_row);
#pragma unroll
    for (int i = 0; i < V; i += 2) dst[i >> 1] = make_float2(r[i], r[i + 1]);
}

// Slot p of the prefetched emissions (eb, el: a frame's blank and H labels per slot) refilled with the k-th frame
// the direction visits (frame k forward, Tn - 1 - k BACKWARD), if there is one.
template <int H, int P, bool BACKWARD>
__device__ __forceinline__ void refill_emissions(const float* em_base, int k, int Tn, int Lmax, int lane, int L,
                                                 float (&eb)[P], float (&el)[P][H], int p) {
    if (k < Tn) {
        frame_emissions<H>(em_base + (size_t)(BACKWARD ? Tn - 1 - k : k) * (Lmax + 1), lane, L, eb[p], el[p]);
    }
}

// The P slots filled with the first P frames the direction visits (-inf past its Tn frames).
template <int H, int P, bool BACKWARD>
__device__ __forceinline__ void prefetch_emissions(const float* em_base, int Tn, int Lmax, int lane, int L,
                                                   float (&eb)[P], float (&el)[P][H]) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        eb[p] = NEG_INF;
#pragma unroll
        for (int q = 0; q < H; ++q) el[p][q] = NEG_INF;
        refill_emissions<H, P, BACKWARD>(em_base, p, Tn, Lmax, lane, L, eb, el, p);
    }
}
