// Constants and the kernel parameters shared by the KL backward's kernels (kl_backward.cu).
#pragma once

#include <cstdint>

#include "common/constants.cuh"

namespace msa {
namespace {

constexpr int kSlots = kTopK;                 // dQI partial slots per (group, query): writer ranks
constexpr int kItemPairs = 512;               // (query, group) pairs per work item
constexpr int kDkiPart = kBlock * kIndexDim;  // floats of one item's dKI partial
constexpr int kItemWords = 4;                 // (physical block, first pair, end pair, 0)
constexpr int kTableThreads = 1024;           // items kernel: one CTA
constexpr int kReduceThreads = 256;           // dqi and dki reductions
constexpr unsigned kFull = 0xffffffffu;

// What kl_main_kernel reads: the tensors of MsaKlParams plus the workspace parts and the scale.
struct KlKernelParams {
    const uint16_t* q;
    const uint16_t* k;
    const float* teacher_lse;
    const uint16_t* qi;
    const uint16_t* ki;
    const float* indexer_lse;
    const int32_t* row_ptr;  // phys_row_ptr [4, P + 1]
    const int32_t* q_idx;    // phys_q_indices [4, T * 16]
    const int32_t* valid;    // phys_valid [4, T * 16]
    const int32_t* items;
    const int32_t* block_items;
    float* dqi_part;
    float* dki_part;
    uint16_t* dki;
    float grad_scale;
};

}  // namespace
}  // namespace msa
