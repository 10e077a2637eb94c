// GPU-scope counters that order accumulations across CTAs (the deterministic sm_90a backward).
// Writer: its adds complete (for bulk reduce-adds: cp.async.bulk.wait_group 0, then
// fence_proxy_async_global), then fence_acq_rel_gpu and a relaxed store of the next value (a
// release: the fence is cumulative over what the thread, or its CTA through a barrier, wrote).
// Reader: sees the value by a relaxed load, then fence_acq_rel_gpu (the acquire) and, before a
// bulk reduce-add, fence_proxy_async_global.
#pragma once

#include <cstdint>

namespace msa::sm90 {

__device__ __forceinline__ int ld_relaxed_gpu(const int32_t* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_relaxed_gpu(int32_t* p, int v) {
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

// Orders generic-proxy global accesses against async-proxy ones (bulk copies, reduce-adds).
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Spins until *p >= target (`seen`, a value read earlier, saves the first round trip); the caller
// acquires (fence_acq_rel_gpu) after its last spin.
__device__ __forceinline__ void spin_at_least(const int32_t* p, int seen, int target) {
    while (seen < target) seen = ld_relaxed_gpu(p);
}

}  // namespace msa::sm90
