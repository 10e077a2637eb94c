// Forward epilogue: O = acc / l in bf16 and LSE = (m + log2 l) ln 2 for the 16 heads of a warp's
// query. A row that saw no key (empty selection) has l = 0 and gets O = 0, LSE = -inf
// (docs/contract.md §2.3, empty sets).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/softmax.cuh"

namespace msa {

// out_rows: the 16 rows [16 heads][128 d] of the query's group; lse_rows: their 16 LSE values.
__device__ __forceinline__ void fwd_epilogue(const float (&o)[kHeadDim / 8][4], const OnlineSoftmax& sm,
                                             uint16_t* __restrict__ out_rows, float* __restrict__ lse_rows) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(sm.l[r]);
        inv[r] = l > 0.f ? 1.f / l : 0.f;
        if (t == 0) lse_rows[g + 8 * r] = l > 0.f ? (sm.m[r] + log2f(l)) * kLn2 : -INFINITY;
    }
#pragma unroll
    for (int nt = 0; nt < kHeadDim / 8; ++nt) {
        const int col = 8 * nt + 2 * t;
        *reinterpret_cast<uint32_t*>(out_rows + g * kHeadDim + col) = pack_bf16(o[nt][0] * inv[0], o[nt][1] * inv[0]);
        *reinterpret_cast<uint32_t*>(out_rows + (g + 8) * kHeadDim + col) =
            pack_bf16(o[nt][2] * inv[1], o[nt][3] * inv[1]);
    }
}

}  // namespace msa
