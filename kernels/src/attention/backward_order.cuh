// Deterministic mode of the sm_90a backward (host mirror: msa_plan::backward::kv_order): the
// fixed order in which the items of a split row (a (group, block) row of the CSR processed by
// several items) add their dK/dV partials into the row's fp32 slot. The main kernel enforces it
// with a semaphore per slot (the item of rank r waits until the counter reads r, adds, and sets
// r + 1). dQ needs no order: its contributions add exactly (backward_det_grid.cuh).
//
// The order follows an estimated timeline of the persistent schedule, so that an item rarely
// waits: the item at list position I (the run order of backward_items.cuh) runs on CTA I % G
// (static striding over G resident CTAs) and starts at start(I) = sum over the earlier items of
// that CTA of (tiles + kItemOverheadTiles). Its dK/dV addition gets the key (half-tile time, CTA)
//   (2 (start(I) + tiles) - 1) * G + I % G,
// and each slot takes its items in ascending key order (rank = number of the row's items with a
// smaller key).
//
// Deadlock freedom: the keys of one CTA's additions increase strictly in its program order (the
// next item starts at start + tiles + overhead), and an addition waits only for additions with
// smaller keys. All G CTAs are resident (G <= SMs, one CTA per SM). Take the blocked wait with
// the smallest key K: it waits for an addition E with a key below K, and E's CTA reaches E
// through waits with keys below key(E) < K only — none of them blocked by minimality, and its
// other waits (mbarriers of its own producer, which never waits on another CTA) follow its own
// earlier work. So E happens, a contradiction.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "attention/backward_items.cuh"

namespace msa {

constexpr int kItemOverheadTiles = MSA_ITEM_OVERHEAD_TILES;  // K/V load and dK/dV store of an item
constexpr int kOrderThreads = 256;

__host__ __device__ inline uint64_t order_key(int64_t half_time, int cta, int grid) {
    return static_cast<uint64_t>(half_time) * static_cast<uint64_t>(grid) + static_cast<uint64_t>(cta);
}

namespace {

__device__ __forceinline__ int item_tiles(int4 item) {
    return (item.w - item.z + kItemTileQueries - 1) / kItemTileQueries;
}

__device__ __forceinline__ uint64_t dkv_key(int4 item, int start, int it, int grid) {
    return order_key(2 * (static_cast<int64_t>(start) + item_tiles(item)) - 1, it % grid, grid);
}

// One CTA: item_start of every item (counts[0] of them), each CTA lane of the schedule summing
// its items in order with 8 loads in flight.
__global__ void __launch_bounds__(kOrderThreads)
    backward_order_start_kernel(const int4* __restrict__ items, const int32_t* __restrict__ counts, int grid,
                                int32_t* __restrict__ item_start) {
    constexpr int kUnroll = 8;
    const int n = counts[0];
    for (int c = threadIdx.x; c < grid; c += blockDim.x) {
        int acc = 0;
        for (int base = c; base < n; base += kUnroll * grid) {
            int tiles[kUnroll];
#pragma unroll
            for (int k = 0; k < kUnroll; ++k) {
                const int it = base + k * grid;
                tiles[k] = it < n ? item_tiles(items[it]) : 0;
            }
#pragma unroll
            for (int k = 0; k < kUnroll; ++k) {
                const int it = base + k * grid;
                if (it < n) {
                    item_start[it] = acc;
                    acc += tiles[k] + kItemOverheadTiles;
                }
            }
        }
    }
}

// Per item (grid-stride, a warp per item): its rank among its split row's items (ids
// consecutive, positions anywhere) by dK/dV key; 0 for a row of one item.
__global__ void __launch_bounds__(kOrderThreads)
    backward_order_dkv_kernel(const int4* __restrict__ items, const int32_t* __restrict__ counts,
                              const int32_t* __restrict__ order, const int32_t* __restrict__ position,
                              const int32_t* __restrict__ item_start, const int32_t* __restrict__ phys_row_ptr,
                              int blocks, int grid, int32_t* __restrict__ dkv_rank) {
    const int n = counts[0], lane = threadIdx.x & 31, warps = kOrderThreads / 32;
    for (int it = blockIdx.x * warps + (threadIdx.x >> 5); it < n; it += gridDim.x * warps) {
        const int4 item = items[it];
        const int g = item.x;
        const int32_t* ptr = phys_row_ptr + static_cast<int64_t>(g) * (blocks + 1) + item.y;
        const int lo = ptr[0], len = ptr[1] - lo;
        const int first = order[it] - (item.z - lo) / kKvItemQueries;
        const int row_items = (len + kKvItemQueries - 1) / kKvItemQueries;
        const uint64_t mine = dkv_key(item, item_start[it], it, grid);
        int below = 0;
        for (int i = lane; i < row_items; i += 32) {
            const int other = position[first + i];
            below += other != it && dkv_key(items[other], item_start[other], other, grid) < mine;
        }
        below = __reduce_add_sync(0xffffffffu, below);
        if (lane == 0) dkv_rank[it] = below;
    }
}

}  // namespace

}  // namespace msa
