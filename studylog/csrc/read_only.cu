// A kernel that only reads `n16` x 16 bytes from device memory into the SMs: the floor under any kernel that must
// read them once (studylog.bench.read_only). 1024 threads, two blocks an SM, each thread two 16-byte loads in
// flight, the whole grid striding over the bytes together: the fastest of the ways a sweep tried on the H200.
extern "C" __global__ void __launch_bounds__(1024) read_only(const uint4 *__restrict__ src, unsigned long long n16,
                                                             unsigned *__restrict__ sink) {
    unsigned acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + stride < n16; i += 2 * stride) {
        uint4 v[2];
#pragma unroll
        for (int u = 0; u < 2; ++u)  // both loads issued before either is used; not kept in L1
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                         : "l"(src + i + u * stride));
#pragma unroll
        for (int u = 0; u < 2; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (i < n16) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;  // (almost) never: the loads must not be dropped
}
