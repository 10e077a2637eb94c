// MSA v1 shape constants shared by the attention kernels (docs/contract.md §1.1: the public API
// fixes them).
#pragma once

namespace msa {

constexpr int kHeads = 64;         // query heads
constexpr int kGroups = 4;         // KV heads; query head h reads group h / 16
constexpr int kHeadsPerGroup = 16; // = the M of one mma.sync m16n8k16 tile
constexpr int kHeadDim = 128;
constexpr int kBlock = 128;        // keys per selected block
constexpr int kTopK = 16;          // selection slots per (group, query)

// softmax_scale = 128^-0.5; scores enter exp2 as s * scale * log2(e).
constexpr float kScale = 0.088388347648318440550f;
constexpr float kLog2e = 1.442695040888963407360f;
constexpr float kScaleLog2e = kScale * kLog2e;
constexpr float kLn2 = 0.693147180559945309417f;

// Elements per token row of k, v, dk, dv and the dK/dV pools ([rows, 4, 128]).
constexpr int kKRowElems = kGroups * kHeadDim;

}  // namespace msa
