// Device item build of the sm_90a backward (host mirror: msa_plan::backward::kv_items): every
// (head, physical block) row of prepare's physical CSR cut into items of at most kKvItemQueries
// consecutive entries, ids head-major and blocks ascending; a row cut into several items gets the
// next dK/dV accumulator slot. The main kernel's CTAs claim the list's items as they free up, so
// the list follows the L2, not a static balance: items by band (head, where the first query lies:
// msa_plan::backward::kv_items::item_band), so that the items in flight together share queries,
// except a longest-first tail of the shortest, whose tiles add up to grid times half the longest
// item's (common/lpt_order.cuh: claim_order), which evens out the last claims. One CTA scans the
// 4 P rows in chunks of its size, so the tables are built without a host round trip
// (graph-capturable) and equal the mirror word for word.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/lpt_order.cuh"
#include "common/scan.cuh"

namespace msa {

constexpr int kKvItemQueries = MSA_KV_ITEM_QUERIES;
constexpr int kItemBuildThreads = 1024;
constexpr int kItemTileQueries = MSA_KV_TILE_QUERIES;  // CSR entries per tile of the main kernel
constexpr int kItemQueryBands = MSA_ITEM_QUERY_BANDS;
// counts: items, dK/dV slots, then the main kernel's counters, zeroed by the build (items claimed,
// dQ-zeroing units claimed, dQ-zeroing units done per group), then from kGroupFirstWord each
// group's first claim index (the item count when it has none), which paces the dQ zeroing.
constexpr int kGroupFirstWord = 3 + 1 + kGroups;
constexpr int kCountWords = kGroupFirstWord + kGroups;
static_assert(kGroups * kItemQueryBands <= kLptBins, "a band is a bin of the stable sort");

// rows [capacity, 4] = (head, block, first entry, end entry) by item id; items [capacity, 4] the
// same in claim order for `grid` CTAs, rows past the count 0; split_slot [4, P]; split_part [4, P]
// = a split row's first part (the deterministic mode's dK/dV partials: one per item of a split
// row, numbered in id order), else -1; counts [kCountWords] = (items, slots, then zeros: the main
// kernel's counters, then each group's first claim index); by_band, rank [capacity] scratch.
// Internal linkage, as every header kernel.
namespace {
__global__ void __launch_bounds__(kItemBuildThreads)
    backward_items_kernel(const int32_t* __restrict__ phys_row_ptr, const int32_t* __restrict__ phys_q_indices,
                          int blocks, int total_q, int capacity, int grid, int4* __restrict__ rows_out,
                          int4* __restrict__ items, int32_t* __restrict__ split_slot, int32_t* __restrict__ split_part,
                          int32_t* __restrict__ counts, int32_t* __restrict__ by_band,
                          int32_t* __restrict__ rank) {
    __shared__ BlockScanSmem<kItemBuildThreads> scan;
    __shared__ LptSmem<kItemBuildThreads> lpt;
    __shared__ int group_first[kGroups];
    if (threadIdx.x < kGroups) group_first[threadIdx.x] = INT32_MAX;  // read after claim_order's barriers
    const int rows = kGroups * blocks;
    int item_base = 0, slot_base = 0, part_base = 0;
    for (int chunk = 0; chunk < rows; chunk += kItemBuildThreads) {
        const int r = chunk + threadIdx.x;
        int lo = 0, hi = 0;
        if (r < rows) {
            const int head = r / blocks, block = r - head * blocks;
            const int32_t* ptr = phys_row_ptr + static_cast<int64_t>(head) * (blocks + 1) + block;
            lo = ptr[0];
            hi = ptr[1];
        }
        const int len = hi - lo;
        const int n = (len + kKvItemQueries - 1) / kKvItemQueries;
        const int split = len > kKvItemQueries ? 1 : 0;
        int n_total, s_total, p_total;
        const int at = item_base + block_exclusive_scan<kItemBuildThreads>(scan, n, n_total);
        const int slot = slot_base + block_exclusive_scan<kItemBuildThreads>(scan, split, s_total);
        const int part = part_base + block_exclusive_scan<kItemBuildThreads>(scan, split ? n : 0, p_total);
        if (r < rows) {
            const int head = r / blocks, block = r - head * blocks;
            split_slot[r] = split ? slot : -1;
            split_part[r] = split ? part : -1;
            for (int i = 0; i < n; ++i) {
                const int begin = lo + i * kKvItemQueries;
                rows_out[at + i] = make_int4(head, block, begin, min(hi, begin + kKvItemQueries));
            }
        }
        item_base += n_total;
        slot_base += s_total;
        part_base += p_total;
    }
    __syncthreads();  // every row of rows_out written (read back below by other threads)
    const int64_t edges = static_cast<int64_t>(total_q) * kTopK;
    stable_bin_sort<kItemBuildThreads>(
        lpt, item_base,
        [&](int i) {
            const int4 r = rows_out[i];
            const int q = min(max(phys_q_indices[r.x * edges + r.z], 0), total_q - 1);
            return r.x * kItemQueryBands + static_cast<int>(static_cast<int64_t>(q) * kItemQueryBands / total_q);
        },
        [&](int i, int j) { by_band[j] = i; });
    __syncthreads();  // by_band complete
    claim_order<kItemBuildThreads>(
        lpt, scan, item_base, grid, rank,
        [&](int k) {
            const int4 r = rows_out[by_band[k]];
            return (r.w - r.z + kItemTileQueries - 1) / kItemTileQueries;
        },
        [&](int k, int p) {
            const int4 r = rows_out[by_band[k]];
            items[p] = r;
            atomicMin(&group_first[r.x], p);
        });
    __syncthreads();  // group_first complete
    for (int i = item_base + threadIdx.x; i < capacity; i += kItemBuildThreads) items[i] = make_int4(0, 0, 0, 0);
    if (threadIdx.x == 0) {
        counts[0] = item_base;
        counts[1] = slot_base;
    }
    if (threadIdx.x >= 2 && threadIdx.x < kGroupFirstWord) counts[threadIdx.x] = 0;
    if (threadIdx.x < kGroups) counts[kGroupFirstWord + threadIdx.x] = min(group_first[threadIdx.x], item_base);
}
}  // namespace

}  // namespace msa
