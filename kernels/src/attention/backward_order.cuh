// Deterministic mode of the sm_90a backward (host mirror: msa_plan::backward::kv_order): the
// fixed order in which the contributions to one dQ tile (query t, group g: 16 heads x 128 fp32)
// and to one split row's dK/dV slot are accumulated. The main kernel enforces it with a
// semaphore per dQ tile and per slot (a contribution of rank r waits until the counter reads r,
// adds, and sets r + 1).
//
// The order follows an estimated timeline of the persistent schedule, so that a contribution
// rarely waits: the item at list position I (the run order of backward_items.cuh) runs on CTA
// I % G (static striding over G resident CTAs) and starts at start(I) = sum over the earlier
// items of that CTA of (tiles + kItemOverheadTiles). Every event
// gets the key (half-tile time, CTA):
//   the dQ reduction of tile j of item I:  2 (start(I) + j)            * G + I % G,
//   the dK/dV addition of item I:          (2 (start(I) + tiles) - 1) * G + I % G,
// and each dQ tile / slot accumulates its contributions in ascending key order (rank = number of
// its contributions with a smaller key). Ranking by item index instead (ascending blocks) would
// make a query's contribution from its own block, processed first, wait for the one from the
// block 15 back, processed 96 tiles later in its item (recent16): 8x fewer items in flight.
//
// Deadlock freedom: the keys of one CTA's events increase strictly in its program order (j < tiles,
// and the next item starts at start + tiles + overhead), and an event waits only for events with
// smaller keys. All G CTAs are resident (G <= SMs, one CTA per SM). Take the blocked wait with
// the smallest key K: it waits for an event E with a key below K, and E's CTA reaches E through
// waits with keys below key(E) < K only — none of them blocked by minimality, and its other
// waits (mbarriers of its own producer, which never waits on another CTA) follow its own earlier
// work. So E happens, a contradiction. The main kernel must keep this: a dQ tile's counter is
// set after the tile's reduce-adds complete, at the latest before the CTA's next semaphore wait
// (the next tile's, or its item's dK/dV wait).
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "attention/backward_items.cuh"

namespace msa {

constexpr int kItemOverheadTiles = MSA_ITEM_OVERHEAD_TILES;  // K/V load and dK/dV store of an item
constexpr int kOrderThreads = 256;
constexpr int kOrderEntryThreads = 512;  // one thread per CSR entry of an item (kKvItemQueries)
static_assert(kOrderEntryThreads >= kKvItemQueries, "one thread per entry of an item");

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

// Per item (grid-stride over positions, one thread per CSR entry): each entry with a valid query
// appends the key of its dQ reduction to its (group, query) list (slot by atomic counter: the list
// is a set, its order never matters); warp 0 ranks the item among its split row's items (ids
// consecutive, positions anywhere) by dK/dV key. tg_count [4, T] zeroed before; lists [4, T, 16].
__global__ void __launch_bounds__(kOrderEntryThreads)
    backward_order_keys_kernel(const int4* __restrict__ items, const int32_t* __restrict__ counts,
                               const int32_t* __restrict__ order, const int32_t* __restrict__ position,
                               const int32_t* __restrict__ item_start, const int32_t* __restrict__ phys_row_ptr,
                               const int32_t* __restrict__ phys_q_indices, int total_q, int blocks, int grid,
                               int32_t* __restrict__ tg_count, uint64_t* __restrict__ lists,
                               int32_t* __restrict__ dkv_rank) {
    const int n = counts[0];
    const int64_t per_group = static_cast<int64_t>(total_q) * kTopK;
    for (int it = blockIdx.x; it < n; it += gridDim.x) {
        const int4 item = items[it];
        const int g = item.x, start = item_start[it];
        const int e = item.z + static_cast<int>(threadIdx.x);
        if (e < item.w) {
            const int t = phys_q_indices[g * per_group + e];
            if (t >= 0 && t < total_q) {
                const int tg = g * total_q + t;
                const int slot = atomicAdd(&tg_count[tg], 1);
                if (slot < kTopK)
                    lists[static_cast<int64_t>(tg) * kTopK + slot] =
                        order_key(2 * (static_cast<int64_t>(start) + threadIdx.x / kItemTileQueries), it % grid, grid);
            }
        }
        if (threadIdx.x < 32) {
            const int32_t* ptr = phys_row_ptr + static_cast<int64_t>(g) * (blocks + 1) + item.y;
            const int lo = ptr[0], len = ptr[1] - lo;
            const int first = order[it] - (item.z - lo) / kKvItemQueries;
            const int row_items = (len + kKvItemQueries - 1) / kKvItemQueries;
            const uint64_t mine = dkv_key(item, start, it, grid);
            int below = 0;
            for (int i = static_cast<int>(threadIdx.x); i < row_items; i += 32) {
                const int other = position[first + i];
                below += other != it && dkv_key(items[other], item_start[other], other, grid) < mine;
            }
            below = __reduce_add_sync(0xffffffffu, below);
            if (threadIdx.x == 0) dkv_rank[it] = below;
        }
    }
}

// Per item: the rank of each entry's dQ reduction among its (group, query) list.
__global__ void __launch_bounds__(kOrderEntryThreads)
    backward_order_ranks_kernel(const int4* __restrict__ items, const int32_t* __restrict__ counts,
                                const int32_t* __restrict__ item_start, const int32_t* __restrict__ phys_q_indices,
                                int total_q, int grid, const int32_t* __restrict__ tg_count,
                                const uint64_t* __restrict__ lists, uint8_t* __restrict__ dq_rank) {
    const int n = counts[0];
    const int64_t per_group = static_cast<int64_t>(total_q) * kTopK;
    for (int it = blockIdx.x; it < n; it += gridDim.x) {
        const int4 item = items[it];
        const int e = item.z + static_cast<int>(threadIdx.x);
        if (e >= item.w) continue;
        const int t = phys_q_indices[item.x * per_group + e];
        if (t < 0 || t >= total_q) continue;
        const int tg = item.x * total_q + t;
        const uint64_t mine =
            order_key(2 * (static_cast<int64_t>(item_start[it]) + threadIdx.x / kItemTileQueries), it % grid, grid);
        const int m = min(tg_count[tg], kTopK);
        int rank = 0;
        for (int s = 0; s < m; ++s) rank += lists[static_cast<int64_t>(tg) * kTopK + s] < mine;
        dq_rank[item.x * per_group + e] = static_cast<uint8_t>(rank);
    }
}

}  // namespace

}  // namespace msa
