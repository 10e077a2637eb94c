// Fragment math of the packed varlen layout (docs/design.md "Layout facts"), shared by every
// attention kernel so that all of them agree on positions, physical blocks and visibility.
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

struct QueryCoord {
    int pos;        // document position p = k_len - q_len + (t - cu_seqlens_q[b])
    int phys_base;  // physical block of the document's block 0
};

__device__ __forceinline__ QueryCoord query_coord(const MsaVarlen& v, int t) {
    const int b = v.query_fragment[t];
    const int first = v.fragment_first[b];
    const int k_base = v.cu_seqlens_k[first];
    const int q_start = v.cu_seqlens_q[b];
    const int k_len = v.cu_seqlens_k[b + 1] - k_base;
    const int q_len = v.cu_seqlens_q[b + 1] - q_start;
    QueryCoord c;
    c.pos = k_len - q_len + (t - q_start);
    c.phys_base = (k_base + first * kBlock) / kBlock;
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
