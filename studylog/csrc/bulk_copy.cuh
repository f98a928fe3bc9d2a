// The copy engine of Hopper GPUs and later (the TMA's bulk copies) and the mbarriers that count its
// bytes in: shared by steps 9 and 10 (ternary_bulk.cu, ternary_w2a8.cu).
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_address(const void *p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbarrier_init(u64 *bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// One arrival that also announces `bytes` still to come from the copy engine.
__device__ __forceinline__ void mbarrier_expect_bytes(u64 *bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(u64 *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

// Wait until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(u64 *bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_address(bar)),
        "r"(parity)
        : "memory");
}

// `bytes` (a multiple of 16) from global to shared memory by the copy engine; the barrier counts them.
// The weights are read once: the cache hint lets L2 evict them first.
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, u32 bytes, u64 *bar, u64 policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(smem_address(dst)), "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
        : "memory");
}

__device__ __forceinline__ u64 evict_first_policy() {
    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// For data that many blocks read (x): the hint lets L2 keep it.
__device__ __forceinline__ u64 evict_last_policy() {
    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
