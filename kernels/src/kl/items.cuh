// KL backward, items: one CTA lays out the work items (per physical block, its 4 groups' CSR
// rows concatenated and cut into runs of at most 512 (query, group) pairs) and per-block item
// ranges. Arch-neutral.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/scan.cuh"
#include "common/varlen.cuh"
#include "kl/kl_common.cuh"

namespace msa {
namespace {

__global__ void __launch_bounds__(kTableThreads)
    kl_items_kernel(const int32_t* __restrict__ row_ptr, const MsaVarlen v, int32_t* __restrict__ items,
                    int32_t* __restrict__ block_items, int capacity) {
    __shared__ BlockScanSmem<kTableThreads> scan;
    const int p = v.padded_kv_blocks;
    int done = 0;
    for (int base = 0; base < p; base += kTableThreads) {
        const int pb = base + threadIdx.x;
        int pairs = 0, n = 0;
        if (pb < p) {
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                const int32_t* r = row_ptr + static_cast<int64_t>(g) * (p + 1) + pb;
                pairs += r[1] - r[0];
            }
            // Padding blocks have no key rows to write (and no pairs).
            if (block_keys(v, pb).count > 0) n = (pairs + kItemPairs - 1) / kItemPairs;
        }
        int total;
        const int at = done + block_exclusive_scan(scan, n, total);
        if (pb < p) {
            block_items[2 * pb] = at;
            block_items[2 * pb + 1] = n;
        }
        for (int i = 0; i < n; ++i) {
            int32_t* it = items + static_cast<int64_t>(at + i) * kItemWords;
            it[0] = pb;
            it[1] = i * kItemPairs;
            it[2] = min(pairs, (i + 1) * kItemPairs);
            it[3] = 0;
        }
        done += total;
    }
    for (int i = done + static_cast<int>(threadIdx.x); i < capacity; i += kTableThreads) {
        int32_t* it = items + static_cast<int64_t>(i) * kItemWords;
        it[0] = -1;
        it[1] = it[2] = it[3] = 0;
    }
}

}  // namespace
}  // namespace msa
