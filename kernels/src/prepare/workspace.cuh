// Prepare, host side: the sizes of one call and the carve of the workspace, shared by
// msa_prepare_workspace_bytes and msa_prepare_metadata so they always agree. Plain host
// arithmetic on the size fields of MsaVarlen (no CUDA call).
#pragma once

#include "common/launch.cuh"
#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct Plan {
    // Sizes.
    int tiles;   // ceil(T / 32): bitmap words of real queries per column
    int levels;  // max(max_blocks, 1): bitmap columns per head
    int rows;    // R
    int blocks;  // P
    size_t bitmap_words;  // 4 * levels * (tiles + 1)
    // Byte offsets into the workspace. [zeroed, zeroed_end) is cleared by one memset per call.
    size_t fault, phys_counts, words, zeroed_end;
    size_t prefix, row_offsets, row_map, row_frag, row_level;
    size_t counts, chunks, row_first, phys_shift, work_offsets;
    size_t total;
};

struct Carver {
    size_t at = 0;
    template <typename T>
    size_t take(size_t count) {
        const size_t here = at;
        at = align_up(at + count * sizeof(T));
        return here;
    }
};

// Checks the sizes and lays the workspace out.
cudaError_t make_plan(const MsaVarlen& v, Plan* p) {
    const long long t = v.total_q, r = v.total_rows, pb = v.padded_kv_blocks, b = v.batch;
    if (t < 0 || r < 0 || pb < 1 || b < 1 || v.max_blocks < 0 || kIndexHeads * kTopK * t > INT32_MAX ||
        kIndexHeads * (r + 1) > INT32_MAX || kIndexHeads * (pb + 1) > INT32_MAX || (t > 0 && r < 1)) {
        return cudaErrorInvalidValue;
    }
    p->tiles = int((t + kTileQueries - 1) / kTileQueries);
    p->levels = v.max_blocks > 1 ? v.max_blocks : 1;
    p->rows = int(r);
    p->blocks = int(pb);
    p->bitmap_words = size_t(kIndexHeads) * size_t(p->levels) * (size_t(p->tiles) + 1);
    const size_t head_rows = size_t(kIndexHeads) * size_t(r);
    Carver c;
    p->fault = c.take<unsigned long long>(1);
    p->phys_counts = c.take<int>(size_t(kIndexHeads) * size_t(pb));
    p->words = c.take<unsigned>(p->bitmap_words);
    p->zeroed_end = c.at;
    p->prefix = c.take<int>(p->bitmap_words);
    p->row_offsets = c.take<int>(size_t(b) + 1);
    p->row_map = c.take<int>(size_t(r));
    p->row_frag = c.take<int>(size_t(r));
    p->row_level = c.take<int>(size_t(r));
    p->counts = c.take<int>(head_rows);
    p->chunks = c.take<int>(head_rows);
    p->row_first = c.take<int>(head_rows);
    p->phys_shift = c.take<int>(head_rows);
    p->work_offsets = c.take<int>(head_rows + 1);
    // kAlign bytes of slack: the launcher aligns the workspace base up, so any allocation works.
    p->total = c.at + kAlign;
    return cudaSuccess;
}

unsigned grid_for(long long items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace
}  // namespace msa
