// Constants and fragment facts shared by the prepare kernels (kernels/src/prepare/prepare.cu).
#pragma once

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/varlen.cuh"

namespace msa {
namespace {

constexpr int kWorkWords = MSA_WORK_WORDS;  // scheduler_metadata row
constexpr int kEdgesPerQuery = kIndexHeads * kTopK;  // top-k entries of one query
// Edge threads decode (head, query, slot) from their linear index with shifts.
static_assert(kTopK == 16 && kEdgesPerQuery == 64, "lin = (head * T + q) * 16 + slot");
constexpr unsigned kFullMask = 0xffffffffu;
// The fault word starts as all ones (memset 0xFF): larger than any (lin << 8 | code).
constexpr unsigned long long kNoFault = ~0ull;

constexpr int kThreads = 256;        // every grid-shaped kernel
constexpr int kRowMapThreads = 256;  // one CTA per level

// The fragment facts the kernels below use, evaluated once (common/varlen.cuh's helper).
struct Frag {
    int q_start;
    int q_len;
    int k_len;
    int num_blocks;
    int phys_base;
};

__device__ __forceinline__ Frag fragment(const MsaVarlen& v, int b) {
    const FragmentCoord c = fragment_coord(v, b);
    return Frag{c.q_start, c.q_len, c.k_len, c.num_blocks(), c.phys_base()};
}

}  // namespace
}  // namespace msa
