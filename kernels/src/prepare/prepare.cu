// Prepare family (kernels/include/msa/prepare.h): top-k validation, k2q CSR, work list and
// physical CSR of one selection, equal word for word to msa_plan's host tables. This file holds
// the launcher; the kernels are split by role: edges.cuh (validation, the selection bitmap),
// columns.cuh (column prefixes, rows, offsets), scatter.cuh (CSR slots, tails, work list),
// workspace.cuh (sizes and carve). Arch-neutral plain CUDA (CUB block primitives only).
//
// Pipeline (one stream, no host synchronization, 1 memset + 4 kernels; docs/perf/schedule.md):
//   memset          fault word, physical counts, selection bitmap
//   select_kernel   thread per (head, query): validation (first fault), split_counts, one bit per
//                   edge in column (head, block) of the bitmap
//   level_kernel    CTA per level: prefixes of its 4 columns (a warp each); the rows of the
//                   level (row map) and their edge counts per head
//   offsets_kernel  CTA per (scan, head), 12: row_ptr, phys_row_ptr, the work-item offsets,
//                   work_count, the error word
//   scatter_kernel  thread per (head, query): every edge at its final slot of both CSRs, -1
//                   tails; scheduler_metadata rows
//
// Why this is deterministic and equal to the host: the host scatters edges in (head, query,
// slot) order stably into their rows (msa_plan::csr::scatter_rows), so a row lists its queries
// in ascending packed order, a query at most once. An edge's slot here is its row's start plus
// the number of the row's queries before it, read off the bitmap (a popcount and a prefix), so
// the order is the same and nothing depends on timing: bits are set by atomicOr, counts are
// integer sums, and the first fault is an atomicMax over complemented linear indices.

#include "msa/prepare.h"

#include <cuda_runtime.h>

#include "common/dependent_launch.cuh"
#include "common/launch.cuh"
#include "prepare/columns.cuh"
#include "prepare/edges.cuh"
#include "prepare/scatter.cuh"
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
        workspace == nullptr || workspace_bytes < plan.total || (varlen.total_q > 0 && topk == nullptr)) {
        return cudaErrorInvalidValue;
    }
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    char* ws = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
    auto at = [ws](size_t offset) { return static_cast<void*>(ws + offset); };
    MSA_TRY(cudaMemsetAsync(ws, 0, plan.zeroed_end, s));

    Bitmap bm;
    bm.words = static_cast<unsigned*>(at(plan.words));
    bm.prefix = static_cast<int*>(at(plan.prefix));
    bm.levels = plan.levels;
    bm.stride = plan.tiles + 1;
    auto* fault = static_cast<unsigned long long*>(at(plan.fault));
    const unsigned query_ctas = grid_for(static_cast<long long>(kIndexHeads) * plan.tiles * kTileQueries);
    if (query_ctas > 0) {
        MSA_TRY(launch(select_kernel, query_ctas, kThreads, s, topk, varlen, bm, plan.tiles, fault,
                       out.split_counts));
    }

    RowTables rt;
    rt.phys_counts = static_cast<int*>(at(plan.phys_counts));
    rt.row_offsets = static_cast<int*>(at(plan.row_offsets));
    rt.row_map = static_cast<int*>(at(plan.row_map));
    rt.row_frag = static_cast<int*>(at(plan.row_frag));
    rt.row_level = static_cast<int*>(at(plan.row_level));
    rt.counts = static_cast<int*>(at(plan.counts));
    rt.chunks = static_cast<int*>(at(plan.chunks));
    rt.row_first = static_cast<int*>(at(plan.row_first));
    rt.phys_shift = static_cast<int*>(at(plan.phys_shift));
    rt.doc_ws = out.document_workspace_starts;
    rt.doc_qoff = out.query_offsets;
    rt.target = target_q_per_cta;
    MSA_TRY(launch_dependent(level_kernel, unsigned(plan.levels), kLevelThreads, 0, s, varlen, bm, rt));

    OffsetArgs oa;
    oa.fault = fault;
    oa.counts = rt.counts;
    oa.chunks = rt.chunks;
    oa.phys_counts = rt.phys_counts;
    oa.work_offsets = static_cast<int*>(at(plan.work_offsets));
    oa.row_ptr = out.row_ptr;
    oa.phys_row_ptr = out.phys_row_ptr;
    oa.work_count = out.work_count;
    oa.error_word = out.error_word;
    MSA_TRY(launch_dependent(offsets_kernel, 3 * kIndexHeads, kOffsetThreads, 0, s, varlen, oa));

    ScatterArgs sa;
    sa.topk = topk;
    sa.row_offsets = rt.row_offsets;
    sa.row_map = rt.row_map;
    sa.row_frag = rt.row_frag;
    sa.row_level = rt.row_level;
    sa.counts = rt.counts;
    sa.row_first = rt.row_first;
    sa.phys_shift = rt.phys_shift;
    sa.work_offsets = oa.work_offsets;
    sa.row_ptr = out.row_ptr;
    sa.phys_row_ptr = out.phys_row_ptr;
    sa.q_indices = out.q_indices;
    sa.qsplit = out.qsplit;
    sa.phys_q_indices = out.phys_q_indices;
    sa.phys_valid = out.phys_valid;
    sa.meta = out.scheduler_metadata;
    sa.target = target_q_per_cta;
    sa.capacity = work_capacity;
    sa.tiles = plan.tiles;
    sa.query_ctas = query_ctas;
    MSA_TRY(launch_dependent(scatter_kernel, query_ctas + grid_for(work_capacity), kThreads, 0, s, varlen, bm, sa));
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
