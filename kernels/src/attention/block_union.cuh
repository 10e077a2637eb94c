// Tile scheduler of the query-outer kernels (forward, deterministic dQ): a CTA owns 8 consecutive
// packed queries of one KV group (warp w owns query 8 * blockIdx.x + w, whose 16 heads are the 16
// rows of its mma tiles) and walks the union of the physical blocks they selected, so each K/V
// block is loaded once per CTA however many of its queries chose it.
#pragma once

#include <climits>
#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/varlen.cuh"

namespace msa {

constexpr int kQueriesPerCta = MSA_FWD_TILE_QUERIES;
constexpr int kUnionMax = kQueriesPerCta * kTopK;  // 128 selections at most

// The union, ascending by physical block (deterministic order for the dQ kernel), with each
// block's packed K rows and the bit set of warps that selected it.
struct BlockUnion {
    alignas(16) int cand[kUnionMax];  // selection (warp, slot) as a physical block, -1 if none
    alignas(16) int first[kUnionMax];  // its block if the selection is the block's first occurrence, else INT_MAX
    int pb[kUnionMax];
    int start[kUnionMax];
    int count[kUnionMax];
    unsigned warps[kUnionMax];
};

// Builds the union for group g and queries t0 .. t0 + 7; returns its length. Every thread of the
// CTA calls it (it contains barriers). A top-k entry counts iff 0 <= e <= p / 128 (the contract's
// valid range; invalid entries are rejected before launch, this only keeps the kernel in bounds).
// Duplicates within or across queries merge: membership is a bit set.
template <int THREADS>
__device__ __forceinline__ int build_block_union(BlockUnion& u, const int32_t* __restrict__ topk,
                                                 const MsaVarlen& v, int g, int t0) {
    static_assert(THREADS >= kUnionMax, "one thread per selection");
    const int tid = threadIdx.x;
    int cand = -1;
    if (tid < kUnionMax) {
        const int t = t0 + tid / kTopK;
        if (t < v.total_q) {
            const int e = topk[(static_cast<int64_t>(g) * v.total_q + t) * kTopK + tid % kTopK];
            const QueryCoord c = query_coord(v, t);
            if (e >= 0 && e <= c.pos / kBlock) cand = c.phys_base + e;
        }
        u.cand[tid] = cand;
        u.warps[tid] = 0u;
    }
    __syncthreads();

    // O(128) scans over shared-memory broadcasts, four candidates per load (the scans' load
    // instructions bound this kernel: docs/perf/attention-forward-sm90.md).
    bool first = cand >= 0;
    if (first) {
        const int4* quads = reinterpret_cast<const int4*>(u.cand);
        for (int j = 0; j < (tid >> 2); ++j) {
            const int4 x = quads[j];
            first = first && x.x != cand && x.y != cand && x.z != cand && x.w != cand;
        }
        for (int j = tid & ~3; j < tid; ++j) first = first && u.cand[j] != cand;
    }
    if (tid < kUnionMax) u.first[tid] = first ? cand : INT_MAX;
    const int n = __syncthreads_count(first);

    if (cand >= 0) {
        int rank = 0;  // distinct blocks below cand
        const int4* quads = reinterpret_cast<const int4*>(u.first);
#pragma unroll 8
        for (int j = 0; j < kUnionMax / 4; ++j) {
            const int4 x = quads[j];
            rank += (x.x < cand) + (x.y < cand) + (x.z < cand) + (x.w < cand);
        }
        if (first) {
            const BlockKeys bk = block_keys(v, cand);
            u.pb[rank] = cand;
            u.start[rank] = bk.start;
            u.count[rank] = bk.count;
        }
        atomicOr(&u.warps[rank], 1u << (tid / kTopK));
    }
    __syncthreads();
    return n;
}

}  // namespace msa
