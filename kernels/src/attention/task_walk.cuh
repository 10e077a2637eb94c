// Tile scheduler of the atomic backward main kernel: the CTA interval of the device task tables
// (docs/contract.md §5.3; desc words MSA_DESC_*, msa/abi.h) and the task rows it walks. A bucket is a maximal run of consecutive rows
// with equal (group, physical kblock); a CTA keeps K/V of the current bucket resident and flushes
// its dK/dV at every bucket change and at the end of its interval (a bucket split across CTAs is
// still correct: each part is reduced with atomics).
#pragma once

#include <cstdint>

#include "msa/abi.h"

namespace msa {

struct RowInterval {
    int lo, hi;  // [lo, hi), empty when lo >= hi
};

// Full CTAs take rows_per_cta rows each, the following ones tail_rows; CTAs of the launch bound
// past grid_ctas get nothing. A capacity overflow arrives as num_task_rows = 0.
__device__ __forceinline__ RowInterval cta_row_interval(const int32_t* __restrict__ desc, int bidx) {
    const int num_rows = desc[MSA_DESC_NUM_TASK_ROWS];
    const int rows_per_cta = desc[MSA_DESC_ROWS_PER_CTA];
    const int num_full = desc[MSA_DESC_NUM_FULL_CTAS];
    const int tail_rows = desc[MSA_DESC_TAIL_ROWS];
    const int grid_ctas = desc[MSA_DESC_GRID_CTAS];
    if (bidx >= grid_ctas) return RowInterval{0, 0};
    // 64-bit so that no descriptor value can overflow the interval arithmetic.
    int64_t lo = static_cast<int64_t>(bidx) * rows_per_cta;
    int64_t len = rows_per_cta;
    if (bidx >= num_full) {
        lo = static_cast<int64_t>(num_full) * rows_per_cta + static_cast<int64_t>(bidx - num_full) * tail_rows;
        len = tail_rows;
    }
    const int64_t hi = lo + len < num_rows ? lo + len : num_rows;
    if (lo >= hi) return RowInterval{0, 0};
    return RowInterval{static_cast<int>(lo), static_cast<int>(hi)};
}

// One row of task_meta [cap, 4] = (0, group, physical kblock, valid slots).
struct TaskRow {
    int g;
    int kblock;
    int valid;
};

__device__ __forceinline__ TaskRow load_task_row(const int32_t* __restrict__ task_meta, int row) {
    const int32_t* m = task_meta + static_cast<int64_t>(row) * MSA_META_WORDS;
    return TaskRow{m[MSA_META_HEAD], m[MSA_META_KBLOCK], m[MSA_META_VALID]};
}

__device__ __forceinline__ bool same_bucket(const TaskRow& a, const TaskRow& b) {
    return a.g == b.g && a.kblock == b.kblock;
}

}  // namespace msa
