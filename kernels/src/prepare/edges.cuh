// Prepare's select phase: the top-k validation (msa_plan::topk's per-slot rule; the first fault)
// and the edges of both CSRs as bits of the selection bitmap (prepare_common.cuh), one thread per
// (head, query).
#pragma once

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

// msa_plan::topk::entry_code; `dup` = an earlier slot of the row holds the same value.
__device__ __forceinline__ int entry_code(int value, bool dup, int own_block, int num_blocks) {
    if (value == MSA_TOPK_PADDING) return MSA_TOPK_OK;
    if (value < 0) return MSA_TOPK_NEGATIVE;
    if (value >= num_blocks) return MSA_TOPK_OUT_OF_RANGE;
    if (value > own_block) return MSA_TOPK_NON_CAUSAL;
    if (dup) return MSA_TOPK_DUPLICATE;
    return MSA_TOPK_OK;
}

struct SelectArgs {
    const int* topk;
    unsigned long long* fault;  // zeroed by the zero phase (kEdges only)
    int* split_counts;
    int tiles;
    unsigned ctas;  // virtual CTAs of the phase
};

// Virtual CTA `block` of the query grid (query_thread). fault = max over faults of
// ~(lin << 8 | code), lin = (head * T + q) * 16 + slot: the zeroed word means no fault, and the
// maximum is the complement of the first fault. kEdges = false (validation only) sets no bitmap
// bit (`bm` is not read) and, instead of the atomicMax, returns the warp's word in every lane (0:
// no fault), which the caller reduces; kEdges = true returns 0.
template <bool kEdges>
__device__ __forceinline__ unsigned long long select_block(const MsaVarlen& v, const Bitmap& bm, const SelectArgs& a,
                                                            unsigned block) {
    const QueryThread t = query_thread(v.total_q, a.tiles, block);
    const int lane = int(threadIdx.x % 32u);
    TopkRow row{};
    Frag f{};
    unsigned long long first_fault = ~0ull;
    if (t.live) {
        f = fragment(v, v.query_fragment[t.q]);
        row.load(a.topk + (static_cast<size_t>(t.head) * v.total_q + t.q) * kTopK, f.num_blocks);
        const int own = (f.k_len - f.q_len + t.q - f.q_start) / kBlock;
#pragma unroll
        for (int s = kTopK - 1; s >= 0; --s) {
            const int code = entry_code(row.value[s], (row.dup >> s) & 1u, own, f.num_blocks);
            if (code != 0) {
                const unsigned long long lin =
                    (static_cast<unsigned long long>(t.head) * v.total_q + t.q) * kTopK + s;
                first_fault = lin << 8 | unsigned(code);
            }
        }
        a.split_counts[t.q * kIndexHeads + t.head] = __popc(row.edges());
    }
    // Lanes hold consecutive queries of one head, so the lowest faulting lane has the warp's first.
    const unsigned faults = __ballot_sync(kFullMask, first_fault != ~0ull);
    if (!kEdges) return faults == 0u ? 0ull : ~__shfl_sync(kFullMask, first_fault, __ffs(int(faults)) - 1);
    if (faults != 0u && lane == __ffs(int(faults)) - 1) atomicMax(a.fault, ~first_fault);

    // One atomicOr per distinct (slot, value) of the warp: the lanes that share it are its bits.
    const unsigned edges = t.live ? row.edges() : 0u;
    const size_t tile_word = t.q / kTileQueries;
#pragma unroll
    for (int s = 0; s < kTopK; ++s) {
        const bool edge = (edges >> s) & 1u;
        const int key = edge ? row.value[s] : -1;
        const unsigned peers = __match_any_sync(kFullMask, key);
        if (edge && key < bm.levels && lane == __ffs(int(peers)) - 1) {
            atomicOr(&bm.words[bm.column(t.head, key) + tile_word], peers);
        }
    }
    return 0ull;
}

// The error word (code, head, query, slot) of the select phase's fault word (0: no fault).
__device__ __forceinline__ void write_error_word(const MsaVarlen& v, unsigned long long fault, int* word) {
    // The first fault is the complement of the largest word.
    const unsigned long long f = ~fault;
    if (f == ~0ull) {
        word[0] = word[1] = word[2] = word[3] = 0;
    } else {
        const unsigned long long lin = f >> 8;
        const long long hq = static_cast<long long>(lin >> 4);
        const int hh = int(hq / v.total_q);
        word[0] = int(f & 0xffu);
        word[1] = hh;
        word[2] = int(hq - static_cast<long long>(hh) * v.total_q);
        word[3] = int(lin & 15u);
    }
}

}  // namespace
}  // namespace msa
