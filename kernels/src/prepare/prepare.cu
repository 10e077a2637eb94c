// Prepare family (kernels/include/msa/prepare.h): top-k validation, k2q CSR, work list and
// physical CSR of one selection, equal word for word to msa_plan's host tables. This file holds
// the launchers; the kernels are split by role: row_map.cuh, edges.cuh (validation and edges),
// csr.cuh (offsets and scatters), schedule.cuh (work list), workspace.cuh (host sizes and carve).
// Arch-neutral (CUB and plain CUDA): no per-architecture path.
//
// Pipeline (one stream, no host synchronization):
//   memsets            fault word, edge counts, -1 fill of the four edge arrays
//   row_map_kernel     level-major row of every (fragment, level), its inverse, per-fragment
//                      workspace starts and query offsets
//   edge_kernel        one thread per top-k entry: validation code, writer rank, split counts,
//                      sort keys/payloads of both CSRs, per-(head, row/block) edge counts
//   error_word_kernel  (code, head, query, slot) of the first fault
//   CUB ExclusiveSum   k2q and physical counts -> edge offsets
//   offsets_kernel     row_ptr, phys_row_ptr, chunks per row
//   CUB ExclusiveSum   chunks -> work-item offsets
//   work_kernel        scheduler_metadata (order head, row, chunk) and work_count
//   CUB SortPairs      k2q edges by (head, row); scatter_k2q_kernel
//   CUB SortPairs      physical edges by (head, block); scatter_phys_kernel
//
// Why this is deterministic and equal to the host: the host visits edges in (head, query, slot)
// order and scatters them stably into their rows (msa_plan::csr::scatter_rows). Edges are
// generated here at index (head*T + query)*16 + slot, i.e. in that same order, and
// cub::DeviceRadixSort is stable, so sorting by the row key alone reproduces the host order.
// Counts are commutative atomic adds; the first fault is an atomicMin over its linear index.

#include "msa/prepare.h"

#include <cuda_runtime.h>

#include <initializer_list>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/launch.cuh"
#include "prepare/csr.cuh"
#include "prepare/edges.cuh"
#include "prepare/row_map.cuh"
#include "prepare/schedule.cuh"
#include "prepare/workspace.cuh"

namespace msa {
namespace {

cudaError_t prepare_workspace_bytes(const MsaVarlen& varlen, size_t* bytes) {
    if (bytes == nullptr) return cudaErrorInvalidValue;
    Plan plan;
    MSA_TRY(make_plan(varlen, &plan));
    *bytes = plan.total;
    return cudaSuccess;
}

cudaError_t prepare_metadata(const int32_t* topk, const MsaVarlen& varlen, int32_t target_q_per_cta,
                             int32_t work_capacity, const MsaPrepareOutputs& out, void* workspace,
                             size_t workspace_bytes, void* stream) {
    Plan plan;
    MSA_TRY(make_plan(varlen, &plan));
    if (target_q_per_cta <= 0 || target_q_per_cta % kTaskQueries != 0 || work_capacity < 1 ||
        workspace == nullptr || workspace_bytes < plan.total ||
        (plan.n_edges > 0 && topk == nullptr)) {
        return cudaErrorInvalidValue;
    }
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    char* ws = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
    auto at = [ws](size_t offset) { return static_cast<void*>(ws + offset); };
    auto* fault = static_cast<unsigned long long*>(at(plan.fault));
    auto* k2q_counts = static_cast<int*>(at(plan.k2q_counts));
    auto* k2q_offsets = static_cast<int*>(at(plan.k2q_offsets));
    auto* chunk_counts = static_cast<int*>(at(plan.chunk_counts));
    auto* work_offsets = static_cast<int*>(at(plan.work_offsets));
    auto* phys_counts = static_cast<int*>(at(plan.phys_counts));
    auto* phys_offsets = static_cast<int*>(at(plan.phys_offsets));
    void* temp = at(plan.temp);
    const size_t n = size_t(plan.n_edges);
    const size_t k2q_n = size_t(plan.k2q_keys) + 1;
    const size_t phys_n = size_t(plan.phys_keys) + 1;

    MSA_TRY(cudaMemsetAsync(fault, 0xFF, sizeof(unsigned long long), s));
    MSA_TRY(cudaMemsetAsync(k2q_counts, 0, k2q_n * sizeof(int), s));
    MSA_TRY(cudaMemsetAsync(phys_counts, 0, phys_n * sizeof(int), s));
    if (n > 0) {
        // Edge slots past each head's edges keep -1 (the host's tail fill).
        for (int32_t* edges : {out.q_indices, out.qsplit, out.phys_q_indices, out.phys_valid}) {
            MSA_TRY(cudaMemsetAsync(edges, 0xFF, n * sizeof(int32_t), s));
        }
    }

    RowMapOut rm;
    rm.row_offsets = static_cast<int*>(at(plan.row_offsets));
    rm.row_map = static_cast<int*>(at(plan.row_map));
    rm.row_frag = static_cast<int*>(at(plan.row_frag));
    rm.row_level = static_cast<int*>(at(plan.row_level));
    rm.doc_ws = out.document_workspace_starts;
    rm.doc_qoff = out.query_offsets;
    // Level 0's CTA also writes the per-fragment arrays, so at least one CTA runs.
    const unsigned levels = varlen.max_blocks > 1 ? unsigned(varlen.max_blocks) : 1u;
    MSA_TRY(launch(row_map_kernel, levels, kRowMapThreads, s, varlen, rm));

    auto* k2q_keys_a = static_cast<unsigned*>(at(plan.k2q_keys_a));
    auto* k2q_vals_a = static_cast<unsigned*>(at(plan.k2q_vals_a));
    auto* phys_keys_a = static_cast<unsigned*>(at(plan.phys_keys_a));
    auto* phys_vals_a = static_cast<unsigned long long*>(at(plan.phys_vals_a));
    auto* keys_b = static_cast<unsigned*>(at(plan.keys_b));
    auto* vals_b = static_cast<unsigned long long*>(at(plan.vals_b));
    if (n > 0) {
        EdgeOut eo;
        eo.fault = fault;
        eo.split_counts = out.split_counts;
        eo.k2q_keys = k2q_keys_a;
        eo.k2q_vals = k2q_vals_a;
        eo.k2q_counts = k2q_counts;
        eo.phys_keys = phys_keys_a;
        eo.phys_vals = phys_vals_a;
        eo.phys_counts = phys_counts;
        eo.row_offsets = rm.row_offsets;
        eo.row_map = rm.row_map;
        MSA_TRY(launch(edge_kernel, grid_for(plan.n_edges), kThreads, s, topk, varlen, eo));
    }
    MSA_TRY(launch(error_word_kernel, 1, 1, s, fault, varlen.total_q, out.error_word));

    size_t temp_bytes = plan.temp_bytes;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, static_cast<const int*>(k2q_counts),
                                          k2q_offsets, int(k2q_n), s));
    temp_bytes = plan.temp_bytes;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, static_cast<const int*>(phys_counts),
                                          phys_offsets, int(phys_n), s));

    OffsetsArgs oa;
    oa.k2q_counts = k2q_counts;
    oa.k2q_offsets = k2q_offsets;
    oa.phys_offsets = phys_offsets;
    oa.row_ptr = out.row_ptr;
    oa.phys_row_ptr = out.phys_row_ptr;
    oa.chunk_counts = chunk_counts;
    oa.target = target_q_per_cta;
    const long long offset_items =
        static_cast<long long>(kIndexHeads) *
            ((varlen.total_rows > varlen.padded_kv_blocks ? varlen.total_rows : varlen.padded_kv_blocks) + 1);
    MSA_TRY(launch(offsets_kernel, grid_for(offset_items), kThreads, s, varlen, oa));

    temp_bytes = plan.temp_bytes;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, static_cast<const int*>(chunk_counts),
                                          work_offsets, int(k2q_n), s));

    WorkArgs wa;
    wa.k2q_counts = k2q_counts;
    wa.work_offsets = work_offsets;
    wa.row_frag = rm.row_frag;
    wa.row_level = rm.row_level;
    wa.meta = out.scheduler_metadata;
    wa.work_count = out.work_count;
    wa.target = target_q_per_cta;
    wa.capacity = work_capacity;
    MSA_TRY(launch(work_kernel, grid_for(work_capacity), kThreads, s, varlen, wa));

    if (n > 0) {
        cub::DoubleBuffer<unsigned> keys(k2q_keys_a, keys_b);
        cub::DoubleBuffer<unsigned> vals32(k2q_vals_a, reinterpret_cast<unsigned*>(vals_b));
        temp_bytes = plan.temp_bytes;
        MSA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, vals32, plan.n_edges, 0,
                                                key_bits(unsigned(plan.k2q_keys)), s));
        MSA_TRY(launch(scatter_k2q_kernel, grid_for(plan.n_edges), kThreads, s, keys.Current(),
                            vals32.Current(), k2q_offsets, varlen.total_rows, plan.n_edges,
                            out.q_indices, out.qsplit));

        cub::DoubleBuffer<unsigned> pkeys(phys_keys_a, keys_b);
        cub::DoubleBuffer<unsigned long long> vals64(phys_vals_a, vals_b);
        temp_bytes = plan.temp_bytes;
        MSA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, pkeys, vals64, plan.n_edges, 0,
                                                key_bits(unsigned(plan.phys_keys)), s));
        MSA_TRY(launch(scatter_phys_kernel, grid_for(plan.n_edges), kThreads, s,
                            pkeys.Current(), vals64.Current(), phys_offsets,
                            varlen.padded_kv_blocks, plan.n_edges, out.phys_q_indices,
                            out.phys_valid));
    }
    return cudaSuccess;
}

}  // namespace
}  // namespace msa

extern "C" int msa_prepare_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    return msa::prepare_workspace_bytes(varlen, bytes);
}

extern "C" int msa_prepare_metadata(const int32_t* topk, MsaVarlen varlen, int32_t target_q_per_cta,
                                    int32_t work_capacity, MsaPrepareOutputs out, void* workspace,
                                    size_t workspace_bytes, void* stream) {
    return msa::prepare_metadata(topk, varlen, target_q_per_cta, work_capacity, out, workspace, workspace_bytes,
                                 stream);
}
