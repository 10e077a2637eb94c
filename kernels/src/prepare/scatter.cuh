// Prepare's scatter phase: the CSR edges at their final slots, the -1 tails and the forward work
// list (msa_plan::csr, msa_plan::schedule::build_work_items), after the level and offsets phases.
#pragma once

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

struct ScatterArgs {
    const int* topk;
    const int* row_offsets;
    const int* row_map;
    const int* row_frag;
    const int* row_level;
    const int* counts;
    const int* row_first;
    const int* phys_shift;
    const int* work_offsets;
    const int* row_ptr;
    const int* phys_row_ptr;
    int* q_indices;
    int* qsplit;
    int* phys_q_indices;
    int* phys_valid;
    int* meta;
    int target;
    int capacity;
    int tiles;
    unsigned query_ctas;  // virtual CTAs of the query part; the rest write scheduler_metadata
    unsigned ctas;        // all virtual CTAs of the phase
};

// Edge (head h, query q, block L) of fragment b sits in its k2q row (b, L) at
// row_ptr[h, row] + #{edges of the row before q}, and in physical block phys_base + L at
// phys_row_ptr[h, pb] + #{edges of the block from the document's earlier fragments} + the same
// count: both rows list queries in ascending packed order, and the count is the column's bits
// between the fragment's first query and q. The bitmap holds each (query, block) once, so a
// duplicate entry is one edge (msa_plan::csr). The row is walked in ascending block order
// (SortedRow), where an edge's writer rank is its position. This phase is bound by the query
// part's instructions (straight-line, 11.6 warps per SM: docs/perf/schedule.md), so the head's
// tables are offset once and each slot indexes them with 32-bit offsets.
__device__ __forceinline__ void scatter_query(const MsaVarlen& v, const Bitmap& bm, const ScatterArgs& a,
                                              const QueryThread& t) {
    if (!t.live) return;
    const int b = v.query_fragment[t.q];
    const Frag f = fragment(v, b);
    SortedRow row;
    row.load(a.topk + (static_cast<size_t>(t.head) * v.total_q + t.q) * kTopK, f.num_blocks);
    const int q_local = t.q - f.q_start;
    const int pos = f.k_len - f.q_len + q_local;
    const int* rows = a.row_map + a.row_offsets[b];
    const size_t hR = static_cast<size_t>(t.head) * v.total_rows;
    const int* row_ptr = a.row_ptr + hR + t.head;  // [h, R + 1]
    const int* row_first = a.row_first + hR;
    const int* phys_shift = a.phys_shift + hR;
    const int* phys_row_ptr = a.phys_row_ptr + static_cast<size_t>(t.head) * (v.padded_kv_blocks + 1) + f.phys_base;
    const int* prefix = bm.prefix + bm.column(t.head, 0) + t.q / kTileQueries;
    const unsigned* words = bm.words + bm.column(t.head, 0) + t.q / kTileQueries;
    const unsigned below = (1u << (t.q % kTileQueries)) - 1u;
    // Loads in two independent rounds (each edge's row and bitmap prefix, then the row's
    // offsets), then all stores: the outputs may alias the tables as far as the compiler knows,
    // so a store between them kept each slot's dependent loads behind the previous slot's
    // stores, 16 round trips in a row.
    unsigned live = 0u;
    int r[kTopK] = {}, before[kTopK] = {};
#pragma unroll
    for (int k = 0; k < kTopK; ++k) {
        if (!row.edge(k, bm.levels)) continue;
        live |= 1u << k;
        r[k] = rows[row.key[k]];
        const size_t at = static_cast<size_t>(row.key[k]) * static_cast<unsigned>(bm.stride);
        before[k] = prefix[at] + __popc(words[at] & below);
    }
    unsigned k2q_off[kTopK] = {}, phys_off[kTopK] = {};
#pragma unroll
    for (int k = 0; k < kTopK; ++k) {
        if (!((live >> k) & 1u)) continue;
        const unsigned rk = static_cast<unsigned>(r[k]);
        k2q_off[k] = static_cast<unsigned>(row_ptr[rk] + before[k] - row_first[rk]);
        phys_off[k] = static_cast<unsigned>(phys_row_ptr[row.key[k]] + before[k] + phys_shift[rk]);
    }
    const size_t head_edges = static_cast<size_t>(t.head) * v.total_q * kTopK;
    int* q_indices = a.q_indices + head_edges;
    int* qsplit = a.qsplit + head_edges;
    int* phys_q_indices = a.phys_q_indices + head_edges;
    int* phys_valid = a.phys_valid + head_edges;
#pragma unroll
    for (int k = 0; k < kTopK; ++k) {
        if (!((live >> k) & 1u)) continue;
        const int first_key = static_cast<int>(row.key[k]) * kBlock;
        q_indices[k2q_off[k]] = q_local;
        qsplit[k2q_off[k]] = q_local | (k << kQsplitRankShift);
        const int block_keys = min(f.k_len - first_key, kBlock);
        const int visible = min(block_keys, max(0, pos + 1 - first_key));
        phys_q_indices[phys_off[k]] = t.q;
        phys_valid[phys_off[k]] = visible | (k << kPhysRankShift);
    }
}

// The -1 tails: slots of the head at or past its edge count, by the warp whose 32 queries own
// slots [16 q0, 16 q0 + 512): lane l writes slot 16 q0 + 32 k + l, so each store is one
// coalesced line (a thread writing its own query's 16 slots touched 16 lines per store; on
// short documents, where most slots are tails, that was most of the kernel). A warp's lanes
// share the head (a head spans whole warps).
__device__ __forceinline__ void scatter_tails(const MsaVarlen& v, const ScatterArgs& a, const QueryThread& t,
                                              int lane) {
    if (t.head >= kIndexHeads) return;
    const int total = a.row_ptr[static_cast<size_t>(t.head) * (v.total_rows + 1) + v.total_rows];
    const int first = (t.q - lane) * kTopK;
    const int end = min(first + kTileQueries * kTopK, v.total_q * kTopK);
    if (end <= total) return;
    const size_t head_edges = static_cast<size_t>(t.head) * v.total_q * kTopK;
#pragma unroll
    for (int k = 0; k < kTopK; ++k) {
        const int slot = first + k * kTileQueries + lane;
        if (slot < total || slot >= end) continue;
        const size_t at = head_edges + slot;
        a.q_indices[at] = -1;
        a.qsplit[at] = -1;
        a.phys_q_indices[at] = -1;
        a.phys_valid[at] = -1;
    }
}

// Work item i belongs to the (head, row) k with W[k] <= i < W[k + 1] (W = exclusive scan of the
// chunks, 4R + 1 entries), chunk c = i - W[k]; the scan order is head-major then row, so the
// items come out in build_work_items order. Rows past the items are 0.
__device__ __forceinline__ void work_item(const MsaVarlen& v, const ScatterArgs& a, int i) {
    if (i >= a.capacity) return;
    const int R = v.total_rows;
    const int keys = kIndexHeads * R;  // W has keys + 1 entries
    const int total = a.work_offsets[keys];
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
        words[MSA_WORK_Q_COUNT] = min(a.target, a.counts[lo] - q_begin);
        words[MSA_WORK_FRAGMENT] = a.row_frag[row];
        words[MSA_WORK_KBLOCK] = a.row_level[row];
    }
    int* out = a.meta + static_cast<size_t>(i) * kWorkWords;
#pragma unroll
    for (int w = 0; w < kWorkWords; ++w) out[w] = words[w];
}

// Virtual CTA `block`: the query grid's first (query_thread), then the work list's.
__device__ __forceinline__ void scatter_block(const MsaVarlen& v, const Bitmap& bm, const ScatterArgs& a,
                                              unsigned block) {
    if (block < a.query_ctas) {
        const QueryThread t = query_thread(v.total_q, a.tiles, block);
        scatter_query(v, bm, a, t);  // first: its loads would wait behind the tails' stores
        scatter_tails(v, a, t, int(threadIdx.x % 32u));
    } else {
        work_item(v, a, int((block - a.query_ctas) * kThreads + threadIdx.x));
    }
}

}  // namespace
}  // namespace msa
