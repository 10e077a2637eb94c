// Prepare: the row map of the layout (level-major k2q rows, their fragment and level) and the
// per-fragment arrays of the task build (document workspace starts, query offsets).
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

// Row map. Row (b, L) = sum_b' min(nb_b', L) + #{b' < b : nb_b' > L} (level-major, as
// msa_plan::layout). One CTA per level L: a block reduce gives the first term, a block scan over
// fragments the second; the same scan over nb gives row_offsets[b] = sum_{b' < b} nb_b', the
// start of fragment b in the compact (fragment, level) -> row table.

struct RowMapOut {
    int* row_offsets;  // [B + 1]
    int* row_map;      // [R]: row of (b, L) at row_offsets[b] + L
    int* row_frag;     // [R]: fragment of each row
    int* row_level;    // [R]: level of each row
    int* doc_ws;       // [B]: document_workspace_starts
    int* doc_qoff;     // [B]: query_offsets
};

__global__ void __launch_bounds__(kRowMapThreads) row_map_kernel(MsaVarlen v, RowMapOut o) {
    using Scan = cub::BlockScan<int, kRowMapThreads>;
    using Reduce = cub::BlockReduce<int, kRowMapThreads>;
    __shared__ union {
        typename Reduce::TempStorage reduce;
        typename Scan::TempStorage scan[2];
    } smem;
    __shared__ int rows_before;
    const int level = blockIdx.x;

    int below = 0;
    for (int b = threadIdx.x; b < v.batch; b += kRowMapThreads) {
        below += min(fragment(v, b).num_blocks, level);
    }
    const int total_below = Reduce(smem.reduce).Sum(below);
    if (threadIdx.x == 0) rows_before = total_below;
    __syncthreads();
    const int base_row = rows_before;

    int active_carry = 0;
    int offset_carry = 0;
    for (int tile = 0; tile < v.batch; tile += kRowMapThreads) {
        const int b = tile + threadIdx.x;
        Frag f{};
        if (b < v.batch) f = fragment(v, b);
        const int active = f.num_blocks > level ? 1 : 0;
        int active_before, active_total, offset, offset_total;
        Scan(smem.scan[0]).ExclusiveSum(active, active_before, active_total);
        Scan(smem.scan[1]).ExclusiveSum(f.num_blocks, offset, offset_total);
        offset += offset_carry;
        if (active) {
            const int row = base_row + active_carry + active_before;
            o.row_map[offset + level] = row;
            o.row_frag[row] = b;
            o.row_level[row] = level;
        }
        if (level == 0 && b < v.batch) {
            o.row_offsets[b] = offset;
            o.doc_ws[b] = f.phys_base * kBlock;
            o.doc_qoff[b] = f.k_len - f.q_len;
        }
        active_carry += active_total;
        offset_carry += offset_total;
        __syncthreads();  // the next tile reuses the scan storage
    }
    if (level == 0 && threadIdx.x == 0) o.row_offsets[v.batch] = offset_carry;
}

}  // namespace
}  // namespace msa
