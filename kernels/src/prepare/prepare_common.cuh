// Constants, fragment facts and the selection bitmap shared by the phases of prepare_kernel
// (kernels/src/prepare/prepare.cu).
#pragma once

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/varlen.cuh"

namespace msa {
namespace {

constexpr int kWorkWords = MSA_WORK_WORDS;  // scheduler_metadata row
static_assert(kTopK == 16, "a query's 16 slots are one thread's registers");
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kTileQueries = 32;  // queries per bitmap word: one warp, lane = q % 32

constexpr int kThreads = 256;       // prepare_kernel's CTA
constexpr int kCtasPerSm = 3;       // <= 80 registers: scatter's 16 slots' loads in flight at once
constexpr int kLevelThreads = 128;  // a level group (half a CTA): a warp per head's column
constexpr int kOffsetItems = 16;    // items per thread per pass of the offsets scans (32 spilled)

// The fragment facts the kernels below use, evaluated once (common/varlen.cuh's helper).
struct Frag {
    int first;
    int q_start;
    int q_len;
    int k_len;
    int num_blocks;
    int phys_base;
};

__device__ __forceinline__ Frag fragment(const MsaVarlen& v, int b) {
    const FragmentCoord c = fragment_coord(v, b);
    return Frag{c.first, c.q_start, c.q_len, c.k_len, c.num_blocks(), c.phys_base()};
}

// The selection bitmap: column (head, level) holds one bit per packed query, set iff the query's
// top-k row of that head selects its fragment's block `level` (0 <= level < num_blocks, first
// occurrence). Word w of a column covers queries 32 w .. 32 w + 31; a column has tiles + 1 words,
// the last always zero, so prefix(T) needs no special case. prefix holds each word's exclusive
// prefix of set bits within its column.
struct Bitmap {
    unsigned* words;  // [4 * levels, stride], zeroed before the select phase
    int* prefix;      // [4 * levels, stride], written by the level phase
    int levels;       // max(max_blocks, 1)
    int stride;       // ceil(T / 32) + 1

    __device__ __forceinline__ size_t column(int head, int level) const {
        return (static_cast<size_t>(head) * levels + level) * stride;
    }
    // Set bits of column `col` at packed queries < x (0 <= x <= T).
    __device__ __forceinline__ int before(size_t col, int x) const {
        const int w = x / kTileQueries;
        const unsigned below = (1u << (x % kTileQueries)) - 1u;
        return prefix[col + w] + __popc(words[col + w] & below);
    }
};

// A top-k row of 16 ints: 4 vector loads when the selection is 16-byte aligned (warp-uniform:
// a row is 64 bytes at a multiple of 64 from the selection's start, so every row has its base's
// alignment), else 16 scalar loads.
__device__ __forceinline__ void load_topk_row(const int* __restrict__ row, int (&value)[kTopK]) {
    if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0u) {
#pragma unroll
        for (int i = 0; i < kTopK / 4; ++i) {
            const int4 x = __ldg(reinterpret_cast<const int4*>(row) + i);
            value[4 * i] = x.x;
            value[4 * i + 1] = x.y;
            value[4 * i + 2] = x.z;
            value[4 * i + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int s = 0; s < kTopK; ++s) value[s] = row[s];
    }
}

// One (head, query) top-k row in registers and the rules of msa_plan::topk and msa_plan::csr:
// an entry is an edge iff 0 <= e < num_blocks and no earlier slot holds the same value.
struct TopkRow {
    int value[kTopK];
    unsigned valid;  // bit s: 0 <= value[s] < num_blocks
    unsigned dup;    // bit s: an earlier slot holds value[s]

    __device__ __forceinline__ void load(const int* __restrict__ row, int num_blocks) {
        load_topk_row(row, value);
        valid = 0u;
        dup = 0u;
#pragma unroll
        for (int s = 0; s < kTopK; ++s) {
            if (value[s] >= 0 && value[s] < num_blocks) valid |= 1u << s;
#pragma unroll
            for (int j = 0; j < s; ++j) {
                if (value[j] == value[s]) dup |= 1u << s;
            }
        }
    }
    __device__ __forceinline__ unsigned edges() const { return valid & ~dup; }
};

// The same row's entries ascending as unsigned keys, each invalid entry (outside [0,
// num_blocks)) as kInvalidKey after the valid ones. In this order msa_plan::csr's rules need no
// pairwise search: an entry is an edge iff it is valid and differs from its predecessor (a
// repeated value is one edge), and an edge's writer rank (the row's valid entries with a smaller
// block id) is its position. 60 compare-exchanges (Green's network, checked on all 2^16 0-1
// inputs), 120 min/max instructions, against ~750 for TopkRow's 120 duplicate and 256 rank
// compares.
constexpr unsigned kInvalidKey = 0xffffffffu;

struct SortedRow {
    unsigned key[kTopK];

    __device__ __forceinline__ void load(const int* __restrict__ row, int num_blocks) {
        int value[kTopK];
        load_topk_row(row, value);
#pragma unroll
        for (int s = 0; s < kTopK; ++s)
            key[s] = value[s] >= 0 && value[s] < num_blocks ? static_cast<unsigned>(value[s]) : kInvalidKey;
        constexpr int kPairs[60][2] = {
            {0, 13}, {1, 12}, {2, 15}, {3, 14}, {4, 8},   {5, 6},   {7, 11},  {9, 10},  {0, 5},  {1, 7},
            {2, 9},  {3, 4},  {6, 13}, {8, 14}, {10, 15}, {11, 12}, {0, 1},   {2, 3},   {4, 5},  {6, 8},
            {7, 9},  {10, 11}, {12, 13}, {14, 15}, {0, 2}, {1, 3},  {4, 10},  {5, 11},  {6, 7},  {8, 9},
            {12, 14}, {13, 15}, {1, 2}, {3, 12}, {4, 6},   {5, 7},   {8, 10},  {9, 11},  {13, 14}, {1, 4},
            {2, 6},  {5, 8},  {7, 10}, {9, 13}, {11, 14}, {2, 4},   {3, 6},   {9, 12},  {11, 13}, {3, 5},
            {6, 8},  {7, 9},  {10, 12}, {3, 4}, {5, 6},   {7, 8},   {9, 10},  {11, 12}, {6, 7},  {8, 9}};
#pragma unroll
        for (int i = 0; i < 60; ++i) {
            const unsigned a = key[kPairs[i][0]], b = key[kPairs[i][1]];
            key[kPairs[i][0]] = min(a, b);
            key[kPairs[i][1]] = max(a, b);
        }
    }
    // Entry k is an edge (first of its value, valid); levels bounds a consistent max_blocks.
    __device__ __forceinline__ bool edge(int k, int levels) const {
        return key[k] < static_cast<unsigned>(levels) && (k == 0 || key[k] != key[k - 1]);
    }
};

// The query-shaped phases (select, scatter) in virtual CTAs of kThreads: thread (head, tile,
// lane) of virtual CTA `block` owns packed query q = 32 tile + lane of that head, so a warp is one
// bitmap word; lanes with q >= T are dead but take part in warp votes.
struct QueryThread {
    int head;
    int q;
    bool live;
};

__device__ __forceinline__ QueryThread query_thread(int total_q, int tiles, unsigned block) {
    // 32-bit: i < 4 * 32 * tiles + 256 (make_plan bounds 64 T below 2^31), and a 64-bit division
    // is a subroutine call whose clobbers made the kernel spill.
    const unsigned i = block * kThreads + threadIdx.x;
    const unsigned per_head = static_cast<unsigned>(tiles) * kTileQueries;
    QueryThread t;
    t.head = int(i / per_head);
    t.q = int(i - static_cast<unsigned>(t.head) * per_head);
    t.live = t.head < kIndexHeads && t.q < total_q;
    return t;
}

}  // namespace
}  // namespace msa
