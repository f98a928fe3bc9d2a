// Shared by steps 18 to 25 (ternary_bulk.cu, ternary_w2a8.cu): the ring of shared-memory stages through
// which the copy engine brings a block's weights, and the sums of the block's warps at the end.
#pragma once
#include "bulk_copy.cuh"

// Dynamic shared memory of a block starts with RING_BARRIER_BYTES of mbarriers (the ring's 2 x STAGES,
// then the kernel's own), then the STAGES stages (RING_BARRIER_BYTES in studylog/ternary/cuda_steps.py).
constexpr int RING_BARRIER_BYTES = 512;

// A block (blockIdx.x: its RT tiles of 16 weight rows; blockIdx.y: its slice of K) and its `warps` consumer
// warps share its tiles ("2bit_tiles": 1 KiB a group) over groups g_begin .. g_end. Chunk c of the ring
// holds, for each tile, groups g_begin + c warps CHUNK .. + warps CHUNK - 1, consecutive in memory, so
// a stage is one copy per tile: [row tile][warp][group][half], 64 pieces of 16 bytes a group. A
// stage's "full" mbarrier counts its bytes in, its "empty" mbarrier counts the consumer warps out,
// and the producer (one thread) refills it then.
template <int RT, int STAGES, int CHUNK>
struct WeightRing {
    static_assert(2 * STAGES * sizeof(u64) + 2 * sizeof(u64) <= RING_BARRIER_BYTES, "the mbarriers must fit");
    u64 *full, *empty;  // STAGES each
    uint4 *stages;
    const uint4 *w;
    int per_chunk, stage_pieces, g_begin, g_end, tile0, tiles, groups;

    __device__ WeightRing(unsigned char *smem, const uint4 *w_, int warps, int N, int groups_, int groups_per_slice)
        : full(reinterpret_cast<u64 *>(smem)), empty(full + STAGES),
          stages(reinterpret_cast<uint4 *>(smem + RING_BARRIER_BYTES)), w(w_), per_chunk(warps * CHUNK),
          stage_pieces(warps * RT * CHUNK * 64), g_begin(blockIdx.y * groups_per_slice),
          g_end(min(g_begin + groups_per_slice, groups_)), tile0(blockIdx.x * RT), tiles((N + 15) / 16),
          groups(groups_) {}

    __device__ int chunks() const { return (g_end - g_begin + per_chunk - 1) / per_chunk; }
    // Room for two more mbarriers (8 bytes each), after the ring's.
    __device__ u64 *spare_barriers() const { return empty + STAGES; }
    // The shared memory after the stages.
    __device__ uint4 *after() const { return stages + STAGES * stage_pieces; }

    // One thread, before any other use (then fence.mbarrier_init and a barrier of the block).
    __device__ void init(int warps) const {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(&full[s], 1);       // the producer's arrival (and the bytes it announces)
            mbarrier_init(&empty[s], warps);  // one arrival per consumer warp
        }
    }

    // The producer: chunk c into stage c % STAGES, once every warp has read what the stage held.
    // Tiles past the last one copy the last one again; their rows are not stored.
    __device__ void fill(int c, u64 policy) const {
        const int s = c % STAGES;
        if (c >= STAGES) mbarrier_wait(&empty[s], ((c / STAGES) - 1) & 1);
        const int gc = g_begin + c * per_chunk;
        const u32 bytes = (u32)min(per_chunk, g_end - gc) * 1024u;
        mbarrier_expect_bytes(&full[s], bytes * RT);
        for (int r = 0; r < RT; ++r)
            bulk_copy(stages + s * stage_pieces + r * per_chunk * 64,
                      w + ((size_t)min(tile0 + r, tiles - 1) * groups + gc) * 64, bytes, &full[s], policy);
    }

    // The first of consumer warp `warp`'s CHUNK groups in chunk c (fewer at the end of the slice).
    __device__ int group(int c, int warp) const { return g_begin + c * per_chunk + warp * CHUNK; }

    // Consumer warp `warp`: waits for chunk c (unless !wait: a probe without copies), loads its groups
    // into a (words 4 t .. 4 t + 3 of rows g and g + 8 of each tile, as step 15), and frees the stage.
    // Returns how many groups it got.
    __device__ int take(int c, int warp, int lane, uint4 (&a)[CHUNK][RT][2], bool wait) const {
        return take_from<RT>(c, warp * CHUNK * 64, group(c, warp), lane, a, wait);
    }

    // Steps 24 and 25 (a ring made with warps = 1: a stage holds CHUNK groups of each of the RT tiles): a consumer
    // warp owns the TILES tiles from tile r on. Waits for chunk c, loads their groups and frees the stage.
    template <int TILES>
    __device__ int take_tiles(int c, int r, int lane, uint4 (&a)[CHUNK][TILES][2]) const {
        return take_from<TILES>(c, r * per_chunk * 64, group(c, 0), lane, a, true);
    }

  private:
    // Both takes: TILES tiles' groups of chunk c, from piece `offset` of its stage on (each tile
    // per_chunk groups further), the first of them group `first`.
    template <int TILES>
    __device__ int take_from(int c, int offset, int first, int lane, uint4 (&a)[CHUNK][TILES][2], bool wait) const {
        const int s = c % STAGES, ng = min(CHUNK, g_end - first);
        if (wait) mbarrier_wait(&full[s], (c / STAGES) & 1);
        const uint4 *mine = stages + s * stage_pieces + offset + lane;
#pragma unroll
        for (int cg = 0; cg < CHUNK; ++cg)
            if (cg < ng)
#pragma unroll
                for (int i = 0; i < TILES; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) a[cg][i][h] = mine[(i * per_chunk + cg) * 64 + 32 * h];
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&empty[s]);  // the stage is in registers: free to refill
        return ng;
    }
};

// A barrier of the consumer warps only (the producer warp may be anywhere).
__device__ __forceinline__ void consumer_barrier(int warps) {
    asm volatile("bar.sync 1, %0;" ::"r"(warps * 32) : "memory");
}

// The block's output tile (16 RT rows of W x 8 MT rows of x), from its consumer warps' C fragments:
// each warp puts value(r, j, c) of its fragments into red[warp][row][column] (shared memory no copy
// will write again), then the consumer threads add them warp by warp, in order (a deterministic
// result), and hand each total to out(row, column, sum) for rows 0 .. 16 RT, columns 0 .. x_rows.
template <int RT, int MT, typename T, typename Value, typename Out>
__device__ __forceinline__ void add_warp_sums(T *red, int warps, int x_rows, Value value, Out out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rows = 16 * RT, cols = 8 * MT;
    consumer_barrier(warps);  // every warp is past its last read of the stages
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                red[(warp * rows + 16 * r + 8 * (c >> 1) + g) * cols + 8 * j + 2 * t + (c & 1)] = value(r, j, c);
    consumer_barrier(warps);
    for (int idx = threadIdx.x; idx < rows * x_rows; idx += warps * 32) {
        const int row = idx % rows, col = idx / rows;
        T sum = 0;
        for (int wi = 0; wi < warps; ++wi) sum += red[(wi * rows + row) * cols + col];
        out(row, col, sum);
    }
}
