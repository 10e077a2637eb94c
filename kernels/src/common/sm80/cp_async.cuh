// cp.async (sm_80): asynchronous 16-byte global -> shared copies in commit groups, the loads of
// the sm_80 pipelines (on sm_90a the same instructions run; TMA replaces them in sm90/ code).
#pragma once

#include <cstdint>

namespace msa {

// 16-byte global -> shared copy that bypasses L1 (.cg: K/V/Q tiles are reused from smem, not L1).
// src_bytes = 0 zero-fills the destination without reading src; callers still pass a valid
// pointer so no out-of-range address is ever formed.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's committed groups are pending. Other threads' copies
// are visible only after a following __syncthreads().
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace msa
