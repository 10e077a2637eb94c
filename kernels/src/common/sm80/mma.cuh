// Warp-level tensor-core MMA of the sm_80 path: ldmatrix fragment loads and mma.sync m16n8k16
// (bf16 -> fp32), with the fragment layouts every caller relies on. Everything here also runs
// on sm_90a (where the sm90/ path uses warpgroup wgmma instead).
#pragma once

#include <cstdint>

#include "common/intrinsics.cuh"

namespace msa {

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

// Packs fp32 accumulator n-tiles 2j and 2j+1 (a 16 x 16 block of columns 16j..16j+15) into the
// bf16 A fragment of k-step j: the C layout of m16n8 tiles is the A layout of m16k16.
template <int NT>
__device__ __forceinline__ void acc_to_a(const float (&s)[NT][4], int j, uint32_t (&a)[4]) {
    a[0] = pack_bf16(s[2 * j][0], s[2 * j][1]);
    a[1] = pack_bf16(s[2 * j][2], s[2 * j][3]);
    a[2] = pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]);
    a[3] = pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3]);
}

}  // namespace msa
