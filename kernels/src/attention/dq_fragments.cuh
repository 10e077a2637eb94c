// The sm_90a backward's dQ accumulator in fragment order. The main kernel stages each tile's dQ
// (the two consumer warpgroups' m64n64 fp32 accumulators) in shared memory for the bulk
// reduce-add, and the accumulator in global memory has the staging's layout (a bulk copy is
// linear). In the natural layout [T, 64, 128] a warp's 8-byte stores of its accumulator rows hit
// one bank 8 times (rows 512 bytes apart: 4x the ideal shared-memory wavefronts, ~1,000 cycles
// per tile, measured by ncu: docs/perf/attention-backward-sm90.md). In fragment order each
// thread's 32 values are 8 consecutive float4 words at a 512-byte warp stride, so every store is
// conflict-free, and the cast to bf16 at the end undoes the permutation (FlashAttention-3 keeps
// its dQ accumulator in the MMA's order for the same reason).
//
// One chunk of 2,048 floats per (query t, group g), at (t * 4 + g) * 2048 (the natural layout's
// offset of the query's 16 heads). In the m64 accumulator warp w of a warpgroup holds rows
// 16w .. 16w + 15 = the 16 heads of query slot w; value v = 4i + 2r + e of lane l is head
// (l >> 2) + 8r, column 8i + 2(l & 3) + e of the warpgroup's 64 (warpgroup wg: columns 64wg..).
// It lies at wg * 1024 + i * 128 + l * 4 + 2r + e: the float4 i of lane l.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/constants.cuh"
#include "common/launch.cuh"

namespace msa::bwd90 {

constexpr int kDqChunk = kHeadsPerGroup * kHeadDim;  // floats per (query, group)
constexpr int kDqHalf = kDqChunk / 2;                // one warpgroup's 64 columns

namespace {  // internal linkage: each including translation unit launches its own

constexpr int kCastThreads = 256;
constexpr int kCastChunks = 2;         // chunks per CTA
constexpr int kCastRowWords = 64 + 4;  // a bf16 row of 128 columns, padded: conflict-free stores
static_assert(kGroups % kCastChunks == 0, "a CTA's chunks are whole: the grid is 4T / kCastChunks");

// dq [T, 64, 128] bf16 (round to nearest even) from the fragment-order accumulator; a CTA per two
// chunks: coalesced float4 loads (one accumulator quad = two bf16 pairs of heads hh and hh + 8),
// transposed through shared memory, coalesced 16-byte stores. CTA `cta` of 4T / kCastChunks, by
// kCastThreads threads (backward_epilogue_kernel).
__device__ __forceinline__ void cast_dq_chunks(const float* __restrict__ accum, uint16_t* __restrict__ dq, int64_t cta) {
    __shared__ __align__(16) uint32_t rows[kCastChunks * kHeadsPerGroup * kCastRowWords];
    const int64_t chunk0 = cta * kCastChunks;
    const float4* src = reinterpret_cast<const float4*>(accum + chunk0 * kDqChunk);
    constexpr int kQuads = kCastChunks * kDqChunk / 4;
#pragma unroll
    for (int f = threadIdx.x; f < kQuads; f += kCastThreads) {
        const float4 x = src[f];
        const int cc = f / (kDqChunk / 4), half = (f >> 8) & 1, i = (f >> 5) & 7, lane = f & 31;
        const int hh = cc * kHeadsPerGroup + (lane >> 2), word = 32 * half + 4 * i + (lane & 3);
        const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
        rows[hh * kCastRowWords + word] = *reinterpret_cast<const uint32_t*>(&lo);
        rows[(hh + 8) * kCastRowWords + word] = *reinterpret_cast<const uint32_t*>(&hi);
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(dq + chunk0 * kDqChunk);
#pragma unroll
    for (int u = threadIdx.x; u < kCastChunks * kDqChunk / 8; u += kCastThreads) {
        const uint32_t* w = &rows[(u >> 4) * kCastRowWords + 4 * (u & 15)];
        dst[u] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// CTAs of the cast for total_q queries.
inline unsigned dq_cast_ctas(int total_q) { return total_q > 0 ? static_cast<unsigned>(total_q) * kGroups / kCastChunks : 0; }

}  // namespace

}  // namespace msa::bwd90
