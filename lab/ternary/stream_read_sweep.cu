// Experiment (tools/experiments/stream_read_sweep.py): how fast can the SMs read N bytes, by the copy
// engine and by plain loads? Not part of the package: read_only.cu keeps the winner.
#include "bulk_copy.cuh"

// Block b reads bytes [b per, (b + 1) per) in chunks through `stages` stages; one thread issues and
// waits, no consumers (touches one word of each chunk).
extern "C" __global__ void stream_tma(const unsigned char *__restrict__ src, unsigned long long total,
                                      unsigned long long per, int chunk, int stages, unsigned *out) {
    extern __shared__ __align__(128) unsigned char smem[];
    u64 *full = reinterpret_cast<u64 *>(smem);
    unsigned char *buf = smem + 1024;
    if (threadIdx.x != 0) return;
    for (int s = 0; s < stages; ++s) mbarrier_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const unsigned long long begin = blockIdx.x * per;
    const unsigned long long end = begin + per < total ? begin + per : total;
    const int n = end > begin ? (int)((end - begin + chunk - 1) / chunk) : 0;
    const u64 policy = evict_first_policy();
    u32 acc = 0;
    auto issue = [&](int c) {
        const int s = c % stages;
        const unsigned long long off = begin + (unsigned long long)c * chunk;
        const u32 bytes = (u32)(end - off < (unsigned long long)chunk ? end - off : chunk);
        mbarrier_expect_bytes(&full[s], bytes);
        bulk_copy(buf + (size_t)s * chunk, src + off, bytes, &full[s], policy);
    };
    for (int c = 0; c < n && c < stages; ++c) issue(c);
    for (int c = 0; c < n; ++c) {
        const int s = c % stages;
        mbarrier_wait(&full[s], (c / stages) & 1);
        acc ^= *reinterpret_cast<volatile u32 *>(buf + (size_t)s * chunk);
        if (c + stages < n) issue(c + stages);
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// U 16-byte loads in flight a thread. layout 0: grid-stride; 1: block b reads its own contiguous part.
template <int U>
__global__ void stream_ldg(const uint4 *__restrict__ src, unsigned long long n16, unsigned long long per16,
                           int layout, unsigned *out) {
    u32 acc = 0;
    unsigned long long i, stride, end;
    if (layout == 0) {
        i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
        stride = (unsigned long long)gridDim.x * blockDim.x;
        end = n16;
    } else {
        const unsigned long long b = blockIdx.x * per16;
        i = b + threadIdx.x;
        stride = blockDim.x;
        end = b + per16 < n16 ? b + per16 : n16;
    }
    for (; i + (U - 1) * stride < end; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint4 *p = src + i + u * stride;
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p));
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < end; i += stride) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}
