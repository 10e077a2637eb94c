// Shared-memory transaction barriers (mbarrier) and named barriers for the warp-specialized
// sm_90a kernels. A pipeline stage has a "full" barrier (the producer arms it with the bytes its
// TMA copies will deliver; consumers wait on its phase) and an "empty" barrier (consumers arrive
// when they have read the stage; the producer waits before refilling it). mbarrier.arrive has
// release and try_wait acquire semantics at CTA scope, so plain shared-memory stores made before
// an arrive are visible to the threads whose wait completes.
#pragma once

#include <cstdint>

#include "common/sm90/wgmma.cuh"

namespace msa::sm90 {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes initialized barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// One arrival that also expects `bytes` of transactions (the TMA copies completing on `bar`).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

// Blocks until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    const uint32_t addr = smem_u32(bar);
    while (!mbar_try_wait(addr, parity)) {
    }
}

// Consumers release a pipeline stage with one arrival per thread: an "empty" barrier counts
// every consumer thread. One arrival per warp after __syncwarp is ordered as well under the PTX
// memory model, but compute-sanitizer racecheck does not follow the warp barrier and reports
// the producer's refill as a race; per-thread arrivals cost no more (M6, docs/perf/README.md).
__device__ __forceinline__ void mbar_release(uint64_t* bar) { mbar_arrive(bar); }

// Named barriers 1..15 (0 is __syncthreads): `threads` threads, a multiple of 32, take part.
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA store,
// wgmma) reads of them.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Orders this thread's generic-proxy global-memory accesses before its later async-proxy ones
// (bulk copies and reductions) to the same addresses, and, after an acquire, those it observed.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// A GPU-scope flag: add with release, read with acquire.
__device__ __forceinline__ void red_release_gpu_add(int32_t* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_relaxed_gpu(const int32_t* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

}  // namespace msa::sm90
