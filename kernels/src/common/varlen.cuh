// Fragment math of the packed varlen layout (docs/design.md "Layout facts"), the one copy every
// kernel family uses, so that all of them agree on positions, physical blocks and visibility.
//
// Causal tests use workspace coordinates: key r of physical block pb sits at pb * 128 + r, and a
// query at document position p of a fragment whose document starts at physical block phys_base
// sits at phys_base * 128 + p. Within one document this is the document-local test 128 e + r <= p
// (pb = phys_base + e); the backward task tables (task_qpos) use the same coordinates.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"

namespace msa {

// Fragment b of the layout (msa_plan::layout::Fragment): its queries are packed rows
// q_start .. q_start + q_len - 1, and its keys are the first k_len keys of its document, which
// starts at packed key row k_base = cu_seqlens_k[first] (first = fragment_first[b]).
struct FragmentCoord {
    int first;  // the document's first fragment
    int k_base;
    int q_start;
    int k_len;
    int q_len;

    // ceil(k_len / 128): the document-local blocks a query of the fragment may select.
    __device__ __forceinline__ int num_blocks() const { return (k_len + kBlock - 1) / kBlock; }
    // Physical block of the document's block 0 (one block of padding per preceding document).
    __device__ __forceinline__ int phys_base() const { return (k_base + first * kBlock) / kBlock; }
    // Document position of local query i: k_len - q_len + i (bottom-right aligned).
    __device__ __forceinline__ int position(int i) const { return k_len - q_len + i; }
};

__device__ __forceinline__ FragmentCoord fragment_coord(const MsaVarlen& v, int b) {
    FragmentCoord f;
    f.first = v.fragment_first[b];
    f.k_base = v.cu_seqlens_k[f.first];
    f.q_start = v.cu_seqlens_q[b];
    f.k_len = v.cu_seqlens_k[b + 1] - f.k_base;
    f.q_len = v.cu_seqlens_q[b + 1] - f.q_start;
    return f;
}

// Packed query t: its document position and its document's first physical block.
struct QueryCoord {
    int pos;        // document position p = k_len - q_len + (t - cu_seqlens_q[b])
    int phys_base;  // physical block of the document's block 0
};

__device__ __forceinline__ QueryCoord query_coord(const MsaVarlen& v, int t) {
    const FragmentCoord f = fragment_coord(v, v.query_fragment[t]);
    QueryCoord c;
    c.pos = f.position(t - f.q_start);
    c.phys_base = f.phys_base();
    return c;
}

// Packed K rows of one physical block: keys r < count live at rows start + r. Padding blocks
// (start = -1) and any count reaching past total_k are clamped, so a loader never forms an
// address outside k / v.
struct BlockKeys {
    int start;
    int count;
};

__device__ __forceinline__ BlockKeys block_keys(const MsaVarlen& v, int pb) {
    BlockKeys b;
    b.start = v.block_key_start[pb];
    b.count = v.block_key_count[pb];
    if (b.start < 0) {
        b.start = 0;
        b.count = 0;
    }
    b.count = max(0, min(b.count, min(kBlock, v.total_k - b.start)));
    return b;
}

// Keys of physical block pb visible to a query at workspace position wpos: key r is visible iff
// r < result (causal pb * 128 + r <= wpos, and stored). 0 for blocks after the query.
__device__ __forceinline__ int visible_keys(int wpos, int pb, int count) {
    return max(0, min(wpos - pb * kBlock + 1, count));
}

}  // namespace msa
