// KL backward, reductions (fixed order, no atomics): dqi from the slot partials of each
// (group, query), dki from the item partials of blocks with several items. Arch-neutral.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/varlen.cuh"
#include "kl/kl_common.cuh"

namespace msa {
namespace {

// One warp per (group, query): lane l sums d columns 4 l .. 4 l + 3 over the query's slots.
__global__ void __launch_bounds__(kReduceThreads)
    kl_dqi_kernel(const float* __restrict__ dqi_part, const int32_t* __restrict__ topk, const MsaVarlen v,
                  float grad_scale, uint16_t* __restrict__ dqi) {
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (kReduceThreads / 32) + (threadIdx.x >> 5);
    if (row >= static_cast<int64_t>(kIndexHeads) * v.total_q) return;  // warp-uniform
    const int t = static_cast<int>(row % v.total_q), g = static_cast<int>(row / v.total_q);
    const int num_blocks = fragment_coord(v, v.query_fragment[t]).num_blocks();
    // The physical CSR has one edge per entry 0 <= e < num_blocks, and the writer ranks of a
    // query's edges are 0 .. count - 1: exactly the slots the main kernel wrote.
    const int e = lane < kTopK ? topk[row * kTopK + lane] : -1;
    const int count = __popc(__ballot_sync(kFull, e >= 0 && e < num_blocks));
    const float4* src = reinterpret_cast<const float4*>(dqi_part + row * kSlots * kIndexDim) + lane;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int slot = 0; slot < count; ++slot) {
        const float4 x = src[slot * (kIndexDim / 4)];
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
    }
    const uint2 out = make_uint2(pack_bf16(acc.x * grad_scale, acc.y * grad_scale),
                                 pack_bf16(acc.z * grad_scale, acc.w * grad_scale));
    *reinterpret_cast<uint2*>(dqi + (static_cast<int64_t>(t) * kIndexHeads + g) * kIndexDim + 4 * lane) = out;
}

// One CTA per physical block with zero or several items (single-item blocks were written by the
// main kernel): thread i sums 4 d columns of one key over the items in order.
__global__ void __launch_bounds__(kReduceThreads)
    kl_dki_kernel(const float* __restrict__ dki_part, const int32_t* __restrict__ block_items, const MsaVarlen v,
                  float grad_scale, uint16_t* __restrict__ dki) {
    const int pb = blockIdx.x;
    const BlockKeys bk = block_keys(v, pb);
    const int first = block_items[2 * pb], n = block_items[2 * pb + 1];
    if (bk.count == 0 || n == 1) return;
    for (int i = threadIdx.x; i < bk.count * (kIndexDim / 4); i += kReduceThreads) {
        const int key = i / (kIndexDim / 4), c = i % (kIndexDim / 4);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int it = 0; it < n; ++it) {
            const float4 x =
                reinterpret_cast<const float4*>(dki_part + static_cast<int64_t>(first + it) * kDkiPart + key * kIndexDim)[c];
            acc.x += x.x;
            acc.y += x.y;
            acc.z += x.z;
            acc.w += x.w;
        }
        const uint2 out = make_uint2(pack_bf16(acc.x * grad_scale, acc.y * grad_scale),
                                     pack_bf16(acc.z * grad_scale, acc.w * grad_scale));
        *reinterpret_cast<uint2*>(dki + (static_cast<int64_t>(bk.start) + key) * kIndexDim + 4 * c) = out;
    }
}

}  // namespace
}  // namespace msa
