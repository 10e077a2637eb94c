// MSA v1 shape constants of the kernels (docs/contract.md §1.1: the public API fixes them), taken from the
// one ABI source kernels/include/msa/abi.h that the Rust side mirrors.
#pragma once

#include "msa/abi.h"

namespace msa {

constexpr int kHeads = MSA_NUM_Q_HEADS;              // query heads
constexpr int kGroups = MSA_NUM_KV_HEADS;            // KV heads; query head h reads group h / 16
constexpr int kHeadsPerGroup = MSA_HEADS_PER_GROUP;  // = the M of one mma.sync m16n8k16 tile
constexpr int kHeadDim = MSA_HEAD_DIM;
constexpr int kBlock = MSA_BLOCK_SIZE;               // keys per selected block
constexpr int kTopK = MSA_TOPK_BLOCKS;               // selection slots per (group, query)
constexpr int kIndexHeads = MSA_NUM_INDEX_HEADS;     // one index head per KV group
constexpr int kIndexDim = MSA_INDEX_DIM;
constexpr int kTaskQueries = MSA_TASK_QUERIES;       // query slots of a backward task row

static_assert(kHeadsPerGroup * kGroups == kHeads, "heads split evenly over the groups");
static_assert(kIndexHeads == kGroups, "the indexer and KL kernels pair index head g with group g");
static_assert(kIndexDim == kHeadDim, "the indexer and KL kernels reuse the 128-column tiles");
static_assert(kTaskQueries == MSA_QUERY_CHUNK, "a task row folds one query chunk");

// Packed edge words of prepare's CSRs: qsplit = q_local | writer_rank << 24 and
// phys_valid = visible_keys | writer_rank << 8.
constexpr int kQsplitRankShift = MSA_QSPLIT_RANK_SHIFT;
constexpr int kPhysRankShift = MSA_PHYSICAL_RANK_SHIFT;
constexpr int kPhysVisibleMask = (1 << kPhysRankShift) - 1;  // visible keys of a phys_valid word
static_assert(kPhysVisibleMask >= kBlock, "a block's visible-key count fits below the rank");

// softmax_scale = 128^-0.5 (double for host-side scale products, float for the kernels); scores
// enter exp2 as s * scale * log2(e).
constexpr double kScaleF64 = MSA_SOFTMAX_SCALE;
constexpr float kScale = 0.088388347648318440550f;
constexpr float kLog2e = 1.442695040888963407360f;
constexpr float kScaleLog2e = kScale * kLog2e;
constexpr float kLn2 = 0.693147180559945309417f;
static_assert(static_cast<float>(kScaleF64) == kScale, "one scale, two precisions");

// Elements per token row of k, v, dk, dv and the dK/dV pools ([rows, 4, 128]).
constexpr int kKRowElems = kGroups * kHeadDim;

}  // namespace msa
