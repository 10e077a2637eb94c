// The sm_90a backward (msa_attn_backward_sm90, and its deterministic mode
// msa_attn_backward_sm90_det): the device item build, the KV-outer main kernel and the epilogue
// of attention/backward_sm90.cuh (the dK/dV finisher beside the dQ cast of
// attention/dq_fragments.cuh), with the dQ accumulator zeroed first; the deterministic mode
// builds its dQ grid (attention/backward_det_grid.cuh) in between and keeps one dK/dV part per
// item of a split row, summed in id order by the epilogue. The dQ accumulator's first group is
// zeroed before the main kernel, which zeroes the others while it works on the first (the list
// is group-major). Compute capability 9.0 only: other
// devices take the mma.sync backward.
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/launch.cuh"
#include "attention/backward_det_grid.cuh"
#include "attention/backward_items.cuh"
#include "attention/backward_sm90.cuh"
#include "attention/dq_fragments.cuh"

namespace msa::bwd90 {
namespace {

// msa_attn_backward_sm90{,_det}_workspace_bytes' parts, each 256-byte aligned; the deterministic
// mode keeps a dK/dV part per item of a split row instead of a slot per row, and adds the dQ grid.
struct Workspace {
    size_t dq_accum, items, rows, by_band, rank, split_slot, split_part, counts, dkv_acc, bytes;
    size_t kv_bound, dq_step;
    int item_capacity;
};

Workspace workspace_layout(const MsaVarlen& vl, bool det) {
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    const size_t t = static_cast<size_t>(vl.total_q), p = static_cast<size_t>(vl.padded_kv_blocks);
    const size_t edges = kGroups * t * kTopK;
    Workspace w;
    w.item_capacity = static_cast<int>(kGroups * p + (edges + kKvItemQueries - 1) / kKvItemQueries);
    // A split row has more than kKvItemQueries entries, so it has fewer than
    // 2 len / kKvItemQueries items: fewer slots than edges / (kKvItemQueries + 1), fewer parts
    // than edges / (kKvItemQueries / 2).
    const size_t slots = det ? edges / (kKvItemQueries / 2) : edges / (kKvItemQueries + 1);
    w.dq_accum = 0;
    w.items = align(t * kHeads * kHeadDim * sizeof(float));
    w.rows = w.items + align(static_cast<size_t>(w.item_capacity) * sizeof(int4));
    w.by_band = w.rows + align(static_cast<size_t>(w.item_capacity) * sizeof(int4));
    w.rank = w.by_band + align(static_cast<size_t>(w.item_capacity) * sizeof(int32_t));
    w.split_slot = w.rank + align(static_cast<size_t>(w.item_capacity) * sizeof(int32_t));
    w.split_part = w.split_slot + align(kGroups * p * sizeof(int32_t));
    w.counts = w.split_part + align(kGroups * p * sizeof(int32_t));
    w.dkv_acc = w.counts + align(kCountWords * sizeof(int32_t));
    w.bytes = w.dkv_acc + align(slots * 2 * kBlock * kHeadDim * sizeof(float));
    w.kv_bound = w.dq_step = w.bytes;
    if (det) {
        w.kv_bound = w.bytes;
        w.dq_step = w.kv_bound + align(kGroups * p * 2 * sizeof(float));
        w.bytes = w.dq_step + align(t * kHeads * sizeof(float));
    }
    return w;
}

template <bool kDet>
cudaError_t run(const MsaAttnBwdParams& a, cudaStream_t stream) {
    const MsaVarlen& vl = a.varlen;
    const Workspace w = workspace_layout(vl, kDet);
    if (a.workspace == nullptr || a.workspace_bytes < w.bytes || !aligned16(a.workspace)) return cudaErrorInvalidValue;
    if (kDet && (a.topk == nullptr || a.dout_norm == nullptr)) return cudaErrorInvalidValue;  // the dQ grid's inputs
    uint8_t* base = static_cast<uint8_t*>(a.workspace);
    float* dq_accum = reinterpret_cast<float*>(base + w.dq_accum);
    int4* items = reinterpret_cast<int4*>(base + w.items);
    int32_t* split_slot = reinterpret_cast<int32_t*>(base + w.split_slot);
    int32_t* split_part = reinterpret_cast<int32_t*>(base + w.split_part);
    int32_t* counts = reinterpret_cast<int32_t*>(base + w.counts);
    float* dkv_acc = reinterpret_cast<float*>(base + w.dkv_acc);
    int sms = 0;
    MSA_TRY(current_device_sms(&sms));

    const int grid = backward_grid(w.item_capacity, sms);
    MSA_TRY(launch(backward_items_kernel, dim3(1), dim3(kItemBuildThreads), stream, a.phys_row_ptr,
                   a.phys_q_indices, vl.padded_kv_blocks, vl.total_q, w.item_capacity, grid,
                   reinterpret_cast<int4*>(base + w.rows), items, split_slot, split_part, counts,
                   reinterpret_cast<int32_t*>(base + w.by_band), reinterpret_cast<int32_t*>(base + w.rank)));
    Params p{};
    if constexpr (kDet) {
        float* kv_bound = reinterpret_cast<float*>(base + w.kv_bound);
        float* dq_step = reinterpret_cast<float*>(base + w.dq_step);
        if (vl.padded_kv_blocks > 0)
            MSA_TRY(launch(backward_kv_bound_kernel, dim3(vl.padded_kv_blocks, kGroups), dim3(kBoundThreads), stream,
                           a.k, a.v, a.phys_row_ptr, vl, kv_bound));
        if (vl.total_q > 0)
            MSA_TRY(launch(backward_dq_step_kernel,
                           dim3((static_cast<unsigned>(vl.total_q) * kGroups + kStepThreads / 16 - 1) / (kStepThreads / 16)),
                           dim3(kStepThreads), stream, a.dout_norm, a.delta, a.topk,
                           static_cast<const float*>(kv_bound), vl, dq_step));
        p.dq_step = dq_step;
        p.split_part = split_part;
    } else {
        MSA_TRY(launch(backward_zero_slots_kernel, dim3(4 * sms), dim3(256), stream,
                       static_cast<const int32_t*>(counts), reinterpret_cast<float4*>(dkv_acc)));
    }
    p.items = items;
    p.counts = counts;
    p.claim = counts + 2;
    p.zero_claim = counts + 3;
    p.zero_done = counts + 4;
    p.group_first = counts + kGroupFirstWord;
    p.phys_q_indices = a.phys_q_indices;
    p.phys_valid = a.phys_valid;
    p.lse = a.lse;
    p.delta = a.delta;
    p.split_slot = split_slot;
    p.phys_row_ptr = a.phys_row_ptr;
    p.varlen = vl;
    p.dq_accum = dq_accum;
    p.dkv_acc = dkv_acc;
    p.dk = a.dk;
    p.dv = a.dv;
    MSA_TRY(launch_backward<kDet>(a.q, a.k, a.v, a.dout, p, w.item_capacity, sms, stream));
    const unsigned n_finish = finish_ctas(vl.padded_kv_blocks), n_cast = dq_cast_ctas(vl.total_q);
    if (n_finish + n_cast == 0) return cudaSuccess;
    return launch(backward_epilogue_kernel, dim3(n_finish + n_cast), dim3(kCastThreads), stream, a.phys_row_ptr,
                  static_cast<const int32_t*>(split_slot), kDet ? static_cast<const int32_t*>(split_part) : nullptr,
                  static_cast<const float*>(dkv_acc), vl,
                  !backward_launches(w.item_capacity, vl.total_q), a.dk, a.dv, n_finish,
                  static_cast<const float*>(dq_accum), a.dq);
}

}  // namespace
}  // namespace msa::bwd90

namespace {

int workspace_bytes(MsaVarlen varlen, size_t* bytes, bool det) {
    if (bytes == nullptr || varlen.total_q < 0 || varlen.padded_kv_blocks < 0) return cudaErrorInvalidValue;
    *bytes = msa::bwd90::workspace_layout(varlen, det).bytes;
    return cudaSuccess;
}

template <bool kDet>
int backward(const MsaAttnBwdParams* params, void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    int sm = 0;
    MSA_TRY(msa::current_device_sm(&sm));
    if (!msa::runs_sm90a(sm)) return cudaErrorNotSupported;
    if (params->varlen.total_q <= 0 && params->varlen.total_k <= 0) return cudaSuccess;
    return msa::bwd90::run<kDet>(*params, s);
}

}  // namespace

extern "C" int msa_attn_backward_sm90_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    return workspace_bytes(varlen, bytes, false);
}

extern "C" int msa_attn_backward_sm90(const MsaAttnBwdParams* params, void* stream) {
    return backward<false>(params, stream);
}

extern "C" int msa_attn_backward_sm90_det_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    return workspace_bytes(varlen, bytes, true);
}

extern "C" int msa_attn_backward_sm90_det(const MsaAttnBwdParams* params, void* stream) {
    return backward<true>(params, stream);
}
