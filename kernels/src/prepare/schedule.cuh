// Prepare: the forward work list (scheduler_metadata, msa_plan::schedule::build_work_items)
// from the chunk offsets of every (head, row).
#pragma once

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

// Work items: item i belongs to the (head, row) k with W[k] <= i < W[k + 1] (W = exclusive scan
// of chunks, 4R + 1 entries), chunk c = i - W[k]; the scan order is head-major then row, so the
// items come out in msa_plan::schedule::build_work_items order. Rows past the items are 0.

struct WorkArgs {
    const int* k2q_counts;
    const int* work_offsets;
    const int* row_frag;
    const int* row_level;
    int* meta;
    int* work_count;
    int target;
    int capacity;
};

__global__ void __launch_bounds__(kThreads) work_kernel(MsaVarlen v, WorkArgs a) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (thread >= a.capacity) return;
    const int i = int(thread);
    const int R = v.total_rows;
    const int keys = kIndexHeads * R;  // W has keys + 1 entries
    const int total = a.work_offsets[keys];
    if (i == 0) *a.work_count = total;
    int words[kWorkWords] = {};
    if (i < total) {
        // Last k with W[k] <= i: rows without chunks share their successor's offset and are
        // skipped because W[k + 1] > i.
        int lo = 0, hi = keys;  // invariant: W[lo] <= i < W[hi]
        while (hi - lo > 1) {
            const int mid = lo + (hi - lo) / 2;
            if (a.work_offsets[mid] <= i) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const int head = lo / R;
        const int row = lo - head * R;
        const int q_begin = (i - a.work_offsets[lo]) * a.target;
        words[MSA_WORK_HEAD] = head;
        words[MSA_WORK_ROW] = row;
        words[MSA_WORK_Q_BEGIN] = q_begin;
        words[MSA_WORK_Q_COUNT] = min(a.target, a.k2q_counts[lo] - q_begin);
        words[MSA_WORK_FRAGMENT] = a.row_frag[row];
        words[MSA_WORK_KBLOCK] = a.row_level[row];
    }
    int* out = a.meta + static_cast<size_t>(i) * kWorkWords;
#pragma unroll
    for (int w = 0; w < kWorkWords; ++w) out[w] = words[w];
}

}  // namespace
}  // namespace msa
