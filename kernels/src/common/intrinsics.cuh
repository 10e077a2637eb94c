// PTX wrappers every target has (sm_80 and later, so sm_90a too): programmatic-launch control
// (no-ops before sm_90), shared-memory addresses, ex2,
// bf16x2 packing and unpacking, fp32 reductions and the shuffles over the 4 lanes of an accumulator row. The
// architecture-specific instruction families live in common/sm80/ (mma.sync, ldmatrix,
// cp.async) and common/sm90/.
#pragma once

#include <cstdint>

namespace msa {

// Programmatic dependent launch: this grid's dependents may start now / this thread waits until
// the grids this one depends on have completed and their writes are visible. No-ops before
// compute capability 9.0, where a dependent grid starts only after the one before it completes.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x; ex2.approx maps -inf to +0, which is how masked scores vanish.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Round two floats to bf16 (nearest even) and pack them, lo in the low half: the register layout
// of an mma fragment pair and of two consecutive bf16 in memory.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The low and high bf16 of a packed pair, exactly, as floats.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Unordered fp32 accumulation of two consecutive floats (8-byte aligned) in global memory.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(addr), "f"(a) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(addr + 1), "f"(b) : "memory");
#endif
}

// Reductions over the 4 lanes (t = lane % 4) that hold one row of an mma accumulator.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace msa
