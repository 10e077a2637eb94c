// Prepare: the top-k validation (msa_plan::topk's per-slot rule, the error word of the first
// fault) and the edges of both CSRs, one thread per top-k entry.
#pragma once

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

// Edges. Thread lin = (head*T + q)*16 + slot owns one top-k entry; the 16 lanes of a half warp
// hold one (head, q) row, so the whole row is visible through shuffles. N = 64*T is a multiple
// of 16, so a half warp is entirely live or entirely past N (dead lanes still shuffle).

struct EdgeOut {
    unsigned long long* fault;  // min over faults of lin << 8 | code
    int* split_counts;          // [T, 4]
    unsigned* k2q_keys;         // [N]: head*R + row, or 4R (sorts last) for a non-edge
    unsigned* k2q_vals;         // [N]: q_local | rank << 24
    int* k2q_counts;            // [4R + 1]
    unsigned* phys_keys;        // [N]: head*P + physical block, or 4P
    unsigned long long* phys_vals;  // [N]: q << 32 | visible | rank << 8
    int* phys_counts;           // [4P + 1]
    const int* row_offsets;     // from row_map_kernel
    const int* row_map;
};

// msa_plan::topk::entry_code; `dup` = an earlier slot of the row holds the same value.
__device__ __forceinline__ int entry_code(int value, bool dup, int own_block, int num_blocks) {
    if (value == MSA_TOPK_PADDING) return MSA_TOPK_OK;
    if (value < 0) return MSA_TOPK_NEGATIVE;
    if (value >= num_blocks) return MSA_TOPK_OUT_OF_RANGE;
    if (value > own_block) return MSA_TOPK_NON_CAUSAL;
    if (dup) return MSA_TOPK_DUPLICATE;
    return MSA_TOPK_OK;
}

__global__ void __launch_bounds__(kThreads) edge_kernel(const int* __restrict__ topk, MsaVarlen v,
                                                        EdgeOut o) {
    const unsigned n = unsigned(kEdgesPerQuery) * unsigned(v.total_q);
    const unsigned lin = blockIdx.x * unsigned(kThreads) + threadIdx.x;
    const bool live = lin < n;
    const int slot = int(lin & 15u);
    const int lane = int(threadIdx.x & 31u);

    int head = 0, q = 0, b = 0, value = -1, q_local = 0, pos = 0;
    Frag f{};
    if (live) {
        const int hq = int(lin >> 4);
        head = hq / v.total_q;
        q = hq - head * v.total_q;
        value = topk[lin];
        b = v.query_fragment[q];
        f = fragment(v, b);
        q_local = q - f.q_start;
        pos = f.k_len - f.q_len + q_local;
    }
    const int nb = f.num_blocks;  // 0 for dead lanes: nothing is valid there
    const bool valid = value >= 0 && value < nb;

    // Writer rank: valid entries of the row with a smaller block id (duplicates share a rank,
    // as msa_plan::csr::query_edges). dup: the same value in an earlier slot.
    int rank = 0;
    bool dup = false;
#pragma unroll
    for (int j = 0; j < kTopK; ++j) {
        const int other = __shfl_sync(kFullMask, value, j, kTopK);
        rank += (other >= 0 && other < nb && other < value) ? 1 : 0;
        dup |= (j < slot && other == value);
    }
    const unsigned valid_mask = __ballot_sync(kFullMask, valid);
    const int code = live ? entry_code(value, dup, pos / kBlock, nb) : 0;
    const unsigned faults = __ballot_sync(kFullMask, code != 0);
    // Lanes of a warp hold consecutive lin, so the lowest faulting lane has the warp's minimum.
    if (faults != 0u && lane == __ffs(int(faults)) - 1) {
        atomicMin(o.fault, (static_cast<unsigned long long>(lin) << 8) | unsigned(code));
    }
    if (!live) return;

    const int R = v.total_rows;
    const int P = v.padded_kv_blocks;
    if (slot == 0) {
        o.split_counts[q * kIndexHeads + head] = __popc((valid_mask >> (lane & 16)) & 0xffffu);
    }
    if (valid) {
        const int row = o.row_map[o.row_offsets[b] + value];
        const int k2q_key = head * R + row;
        o.k2q_keys[lin] = unsigned(k2q_key);
        o.k2q_vals[lin] = unsigned(q_local) | (unsigned(rank) << kQsplitRankShift);
        atomicAdd(&o.k2q_counts[k2q_key], 1);

        const int block_keys = min(f.k_len - value * kBlock, kBlock);
        const int visible = min(block_keys, max(0, pos + 1 - value * kBlock));
        const int phys_key = head * P + f.phys_base + value;
        o.phys_keys[lin] = unsigned(phys_key);
        o.phys_vals[lin] = (static_cast<unsigned long long>(unsigned(q)) << 32) |
                           unsigned(visible | (rank << kPhysRankShift));
        atomicAdd(&o.phys_counts[phys_key], 1);
    } else {
        o.k2q_keys[lin] = unsigned(kIndexHeads * R);
        o.k2q_vals[lin] = 0u;
        o.phys_keys[lin] = unsigned(kIndexHeads * P);
        o.phys_vals[lin] = 0ull;
    }
}

__global__ void error_word_kernel(const unsigned long long* fault, int total_q, int* word) {
    const unsigned long long f = *fault;
    if (f == kNoFault) {
        word[0] = word[1] = word[2] = word[3] = 0;
        return;
    }
    const unsigned lin = unsigned(f >> 8);
    const int hq = int(lin >> 4);
    const int head = hq / total_q;
    word[0] = int(f & 0xffu);
    word[1] = head;
    word[2] = hq - head * total_q;
    word[3] = int(lin & 15u);
}

}  // namespace
}  // namespace msa
