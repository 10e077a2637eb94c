// KL backward of the index branch (contract §3.2), KV-outer like MSA's own kernel and
// deterministic without atomics. This file holds the workspace carve and the launcher; the
// kernels are items.cuh (work items), mainloop_sm80.cuh (the main kernel) and reduce.cuh (dqi,
// dki).
//
// Why KV-outer: the teacher t(j) (16 heads x the block's keys per (query, group)) is the whole
// cost. Query-outer, a CTA of 8 queries walks the union of their selections; with indexer
// selections (near-random blocks per query) that union is ~8 x 16 blocks and each warp works on
// one block in eight. Per physical block the (query, group) pairs that selected it fill whole mma
// tiles instead, and a work item of at most 512 pairs bounds every CTA, sink blocks included.
//
//   items  one CTA lays out the work items: per physical block, its 4 groups' CSR rows
//          concatenated and cut into runs of 512 pairs;
//   main   per item, tiles of 8 pairs of one group (K of that group and the block's ki resident,
//          the tile's q rows double-buffered by cp.async):
//            teacher  S = q K^T (16 heads x 128 keys per pair), t = mean_h exp(S scale - lse_h);
//            dz       z = qi ki^T, dz = bf16(exp(z iscale - indexer_lse) - t) on visible keys;
//            dQI      dz ki for each pair -> f32 partial at (group, query, writer rank), a slot
//                     of its own: the writer rank numbers the query's blocks;
//            dKI      += dz^T qi over the item's pairs, in fp32 registers;
//          the item's dKI goes out in bf16 when the block has one item, else as an f32 partial;
//   dqi    dqi = grad_scale * sum of a query's slot partials in slot order;
//   dki    blocks of several items sum their partials in item order; unselected blocks get 0.
//
// The main kernel uses mma.sync (the sm_80 path, also run on sm_90a); items and reductions are
// arch-neutral.
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/kl.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/launch.cuh"
#include "kl/items.cuh"
#include "kl/kl_common.cuh"
#include "kl/mainloop_sm80.cuh"
#include "kl/reduce.cuh"

namespace msa {
namespace {

struct KlWorkspace {
    size_t dqi_part, dki_part, items, block_items, bytes;  // byte offsets of the parts and the total
    int64_t capacity;                                      // work items
};

constexpr size_t kAlign = 256;

__host__ __forceinline__ size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

__host__ bool kl_workspace(const MsaVarlen& v, KlWorkspace& w) {
    if (v.total_q < 0 || v.padded_kv_blocks < 0) return false;
    const int64_t t = v.total_q, p = v.padded_kv_blocks;
    // Sum over blocks of ceil(pairs / 512) <= P + ceil(sum of pairs / 512), sum of pairs <= 64 T.
    w.capacity = p + (static_cast<int64_t>(kIndexHeads) * kTopK * t + kItemPairs - 1) / kItemPairs;
    w.dqi_part = 0;
    w.dki_part = align_up(static_cast<size_t>(kIndexHeads) * t * kSlots * kIndexDim * sizeof(float));
    w.items = w.dki_part + align_up(static_cast<size_t>(w.capacity) * kDkiPart * sizeof(float));
    w.block_items = w.items + align_up(static_cast<size_t>(w.capacity) * kItemWords * sizeof(int32_t));
    w.bytes = w.block_items + align_up(static_cast<size_t>(p) * 2 * sizeof(int32_t));
    return true;
}

// The four launches; the main kernel is the sm_80 path (mma.sync, also run on sm_90a).
cudaError_t kl_backward_sm80(const MsaKlParams& p, const KlWorkspace& w, uint8_t* ws, cudaStream_t s) {
    const MsaVarlen& varlen = p.varlen;
    const int capacity = static_cast<int>(w.capacity);
    // grad_scale = iscale * loss_coeff / (4 T) in double, rounded once (as the reference).
    const double t = varlen.total_q > 0 ? varlen.total_q : 1;
    const float grad_scale = static_cast<float>(kScaleF64 * static_cast<double>(p.loss_coeff) /
                                                (static_cast<double>(kIndexHeads) * t));

    KlKernelParams a;
    a.q = p.q;
    a.k = p.k;
    a.teacher_lse = p.teacher_lse;
    a.qi = p.qi;
    a.ki = p.ki;
    a.indexer_lse = p.indexer_lse;
    a.row_ptr = p.phys_row_ptr;
    a.q_idx = p.phys_q_indices;
    a.valid = p.phys_valid;
    a.items = reinterpret_cast<const int32_t*>(ws + w.items);
    a.block_items = reinterpret_cast<const int32_t*>(ws + w.block_items);
    a.dqi_part = reinterpret_cast<float*>(ws + w.dqi_part);
    a.dki_part = reinterpret_cast<float*>(ws + w.dki_part);
    a.dki = p.dki;
    a.grad_scale = grad_scale;

    MSA_TRY(launch(kl_items_kernel, 1, kTableThreads, s, p.phys_row_ptr, varlen,
                   reinterpret_cast<int32_t*>(ws + w.items), reinterpret_cast<int32_t*>(ws + w.block_items), capacity));

    if (capacity > 0) {
        MSA_TRY(launch_smem(kl_main_kernel, capacity, kKlThreads, sizeof(KlSmem), s, a, varlen));
    }

    if (varlen.total_q > 0) {
        const int64_t rows = static_cast<int64_t>(kIndexHeads) * varlen.total_q;
        const int64_t ctas = (rows + kReduceThreads / 32 - 1) / (kReduceThreads / 32);
        MSA_TRY(launch(kl_dqi_kernel, static_cast<unsigned>(ctas), kReduceThreads, s, a.dqi_part, p.topk, varlen,
                       grad_scale, p.dqi));
    }

    if (varlen.padded_kv_blocks > 0) {
        MSA_TRY(launch(kl_dki_kernel, varlen.padded_kv_blocks, kReduceThreads, s, a.dki_part, a.block_items, varlen,
                       grad_scale, p.dki));
    }
    return cudaSuccess;
}

}  // namespace
}  // namespace msa

extern "C" int msa_kl_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    msa::KlWorkspace w;
    if (!msa::kl_workspace(varlen, w)) return cudaErrorInvalidValue;
    *bytes = w.bytes;
    return cudaSuccess;
}

extern "C" int msa_kl_backward(const MsaKlParams* params, void* workspace, size_t workspace_bytes, void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    const MsaKlParams& p = *params;
    const MsaVarlen& varlen = p.varlen;
    msa::KlWorkspace w;
    if (!msa::kl_workspace(varlen, w) || workspace_bytes < w.bytes) return cudaErrorInvalidValue;
    if (w.capacity > 0x7fffffff) return cudaErrorInvalidValue;
    if (varlen.total_q == 0 && varlen.total_k == 0) return cudaSuccess;
    uint8_t* ws = static_cast<uint8_t*>(workspace);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return msa::dispatch_arch([&] { return msa::kl_backward_sm80(p, w, ws, s); });
}
