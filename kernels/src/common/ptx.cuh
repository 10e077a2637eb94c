// Thin wrappers over the sm_80 instructions the attention kernels are built from: cp.async,
// ldmatrix, mma.sync m16n8k16 (bf16 -> fp32), ex2, bf16x2 packing and fp32 reductions.
// Everything here also runs on sm_90a; the only arch split is the vector reduction.
#pragma once

#include <cstdint>

namespace msa {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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

// Four 8x8 b16 matrices; lane l supplies the address of row l % 8 of matrix l / 8. Without .trans,
// lane l receives (row l/4, cols 2(l%4), 2(l%4)+1) of each matrix; with .trans it receives
// (rows 2(l%4), 2(l%4)+1; col l/4), i.e. the same positions of the transposed matrix.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D += A * B with A 16x16 row-major (a0: row g, k 2t..2t+1; a1: row g+8; a2: row g, k 2t+8..;
// a3: row g+8, k 2t+8..), B 16x8 "col" (b0: k 2t..2t+1, col g; b1: k 2t+8..), D 16x8 fp32
// (d0, d1: row g, cols 2t, 2t+1; d2, d3: row g+8), where g = lane / 4 and t = lane % 4.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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
