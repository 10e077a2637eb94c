// Forward tile lists for the sm_90a forward: for every (KV group g, tile of 8 consecutive packed
// queries) the union of the physical blocks its queries selected, ascending, each with the
// 8-bit set of tile queries that chose it. The same tiling as the query-outer v1 kernel
// (block_union.cuh), so a tile can go to either kernel: the sm_90a kernel takes tiles whose
// union is small enough that computing all 128 rows against every union block beats v1, v1
// keeps the rest.
//
// Outputs: counts [4, tiles] i32 = union size; entries [4, tiles, 128] int4 = (physical block,
// packed K row of its key 0, stored keys, query mask) for the first `count` slots (the rest is
// never read); wpos [T] i32 = each query's workspace position (phys_base * 128 + p), so the
// attention kernels read one word per query instead of walking cu_seqlens.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/varlen.cuh"
#include "attention/block_union.cuh"
#include "common/dependent_launch.cuh"
#include "common/lpt_order.cuh"

namespace msa {

constexpr int kTileUnionThreads = kUnionMax;  // one thread per (query, slot) of a tile
constexpr int kTileOrderThreads = 1024;

// Grid (tiles, 4), 128 threads. Internal linkage: each including translation unit launches its own.
namespace {
__global__ void __launch_bounds__(kTileUnionThreads)
    tile_union_kernel(const int32_t* __restrict__ topk, const MsaVarlen varlen, int32_t* __restrict__ counts,
                      int4* __restrict__ entries, int32_t* __restrict__ wpos) {
    __shared__ BlockUnion u;
    allow_dependents();  // tile_order_kernel waits for this grid's completion anyway
    const int g = blockIdx.y, tile = blockIdx.x;
    const int t0 = tile * kQueriesPerCta;
    const int n = build_block_union<kTileUnionThreads>(u, topk, varlen, g, t0);
    const int64_t item = static_cast<int64_t>(g) * gridDim.x + tile;
    const int j = threadIdx.x;
    if (j < n) entries[item * kUnionMax + j] = make_int4(u.pb[j], u.start[j], u.count[j], static_cast<int>(u.warps[j]));
    if (j == 0) counts[item] = n;
    if (g == 0 && j < kQueriesPerCta && t0 + j < varlen.total_q) {
        const QueryCoord c = query_coord(varlen, t0 + j);
        wpos[t0 + j] = c.phys_base * kBlock + c.pos;
    }
}

// One CTA of kTileOrderThreads: run [items] int2 = (item, union size) at each list position of
// `grid` CTAs, the union size (its count of blocks) as the cost.
__global__ void __launch_bounds__(kTileOrderThreads)
    tile_order_kernel(const int32_t* __restrict__ counts, int items, int grid, int2* __restrict__ run) {
    __shared__ LptSmem<kTileOrderThreads> lpt;
    grid_dependency_wait();  // tile_union_kernel's counts
    allow_dependents();
    lpt_order<kTileOrderThreads>(
        lpt, items, grid, [&](int i) { return counts[i]; },
        [&](int i, int pos) { run[pos] = make_int2(i, counts[i]); });
}
}  // namespace

}  // namespace msa
