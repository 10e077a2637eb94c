// Prepare family (kernels/include/msa/prepare.h): top-k validation, k2q CSR, work list and
// physical CSR of one selection, equal word for word to msa_plan's host tables. This file holds
// the kernel's phase order and the launcher; the phases are split by role: edges.cuh
// (validation, the selection bitmap), columns.cuh (column prefixes, rows, offsets), scatter.cuh
// (CSR slots, tails, work list), workspace.cuh (sizes and carve). Arch-neutral plain CUDA.
//
// One cooperative launch (docs/perf/schedule.md): on short-document ranks the launch boundaries
// of a memset and 4 kernels cost more than their work, so prepare_kernel runs them as phases of
// one persistent grid (every CTA resident), separated by grid-wide barriers. Each phase loops
// over the CTAs of the kernel it replaces ("virtual CTAs", strided by the grid), so every table
// is written exactly as those kernels wrote it:
//   zero      fault word, physical counts, selection bitmap (was the memset)
//   select    thread per (head, query): validation (first fault), split_counts, one bit per
//             edge in column (head, block) of the bitmap
//   level     128-thread group per level: prefixes of its 4 columns (a warp each); the rows of
//             the level (row map) and their edge counts per head
//   offsets   CTA per (scan, head), 12: row_ptr, phys_row_ptr, the work-item offsets,
//             work_count, the error word
//   scatter   thread per (head, query): every edge at its final slot of both CSRs, -1 tails;
//             scheduler_metadata rows
//
// Why this is deterministic and equal to the host: the host scatters edges in (head, query,
// slot) order stably into their rows (msa_plan::csr::scatter_rows), so a row lists its queries
// in ascending packed order, a query at most once. An edge's slot here is its row's start plus
// the number of the row's queries before it, read off the bitmap (a popcount and a prefix), so
// the order is the same and nothing depends on timing: bits are set by atomicOr, counts are
// integer sums, and the first fault is an atomicMax over complemented linear indices.

#include "msa/prepare.h"

#include <algorithm>
#include <atomic>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "common/arch_dispatch.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "prepare/columns.cuh"
#include "prepare/edges.cuh"
#include "prepare/scatter.cuh"
#include "prepare/workspace.cuh"

namespace msa {
namespace {

// The kernel's one parameter (__grid_constant__: read in place, never copied): passed as separate
// parameters instead, the sm_90a build spilled in the scatter phase, which sits at the
// 80-register cap of 3 CTAs per SM.
struct PrepareArgs {
    MsaVarlen v;
    Bitmap bm;
    uint4* zero;  // [zero_vectors]: the workspace's [0, zeroed_end)
    size_t zero_vectors;
    SelectArgs sel;
    RowTables rt;
    OffsetArgs oa;
    ScatterArgs sa;
};

// Data written by one phase is read by the next only after grid.sync() (release/acquire at
// device scope), with plain loads: nothing written in this kernel is read through
// __restrict__ or __ldg (the non-coherent path). Phase loops are uniform per CTA (per group in
// level), so warp votes and CTA barriers inside a phase see every thread.
__global__ void __launch_bounds__(kThreads, kCtasPerSm) prepare_kernel(const __grid_constant__ PrepareArgs a) {
    __shared__ union {
        LevelSmem level[2];
        OffsetSmem offsets;
    } smem;
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
    for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.zero_vectors; i += stride) {
        a.zero[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    grid.sync();

    for (unsigned b = blockIdx.x; b < a.sel.ctas; b += gridDim.x) select_block<true>(a.v, a.bm, a.sel, b);
    grid.sync();

    {  // two groups per CTA, each its own levels: level L on group L % 2 of CTA (L / 2) % grid
        const int id = int(threadIdx.x) / kLevelThreads;
        const LevelGroup g{id, int(threadIdx.x) % kLevelThreads, int(threadIdx.x % kLevelThreads) / 32,
                           int(threadIdx.x % 32u)};
        for (int level = 2 * int(blockIdx.x) + id; level < a.bm.levels; level += 2 * int(gridDim.x)) {
            level_group(a.v, a.bm, a.rt, level, smem.level[id], g);
        }
    }
    grid.sync();

    for (int j = int(blockIdx.x); j < 3 * kIndexHeads; j += int(gridDim.x)) offsets_job(a.v, a.oa, j, smem.offsets);
    grid.sync();

    for (unsigned b = blockIdx.x; b < a.sa.ctas; b += gridDim.x) scatter_block(a.v, a.bm, a.sa, b);
}

// Slots of msa_prepare_validate's workspace: the most CTAs its grid takes.
constexpr unsigned kValidateSlots = (MSA_PREPARE_VALIDATE_WORKSPACE_BYTES - kAlign) / sizeof(unsigned long long);

struct ValidateArgs {
    MsaVarlen v;
    SelectArgs sel;
    unsigned long long* slots;  // [gridDim.x]: each CTA's largest fault word
    int* error_word;
};

// The largest of every thread's `x` in thread 0 (`warp_max`: one word per warp).
__device__ __forceinline__ unsigned long long block_max(unsigned long long x, unsigned long long* warp_max) {
    for (int d = 16; d > 0; d /= 2) x = max(x, __shfl_xor_sync(kFullMask, x, d));
    if (threadIdx.x % 32u == 0u) warp_max[threadIdx.x / 32u] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < kThreads / 32u; ++w) x = max(x, warp_max[w]);
    }
    __syncthreads();  // warp_max is reused
    return x;
}

// The validation alone (msa_prepare_validate): prepare_kernel's select phase without the bitmap,
// then the error word. What the forward needs: it reads only the validated top-k. Each CTA
// writes its largest fault word to its own slot (no word to zero first); validate_reduce_kernel,
// its programmatic dependent, reduces the slots. Two plain launches instead of a cooperative one
// and its grid barrier: the dependent is launched while this grid runs and only waits.
__global__ void __launch_bounds__(kThreads) validate_kernel(const __grid_constant__ ValidateArgs a) {
    __shared__ unsigned long long warp_max[kThreads / 32];
    griddep_launch_dependents();
    unsigned long long fault = 0ull;
    for (unsigned b = blockIdx.x; b < a.sel.ctas; b += gridDim.x) {
        fault = max(fault, select_block<false>(a.v, Bitmap{}, a.sel, b));
    }
    fault = block_max(fault, warp_max);
    if (threadIdx.x == 0) a.slots[blockIdx.x] = fault;
}

// One CTA: the largest of validate_kernel's `slots` words, then the error word.
__global__ void __launch_bounds__(kThreads) validate_reduce_kernel(const __grid_constant__ ValidateArgs a,
                                                                   unsigned slots) {
    __shared__ unsigned long long warp_max[kThreads / 32];
    // What follows (the forward's order_kernel) waits for this kernel before it touches memory:
    // let it launch now.
    griddep_launch_dependents();
    griddep_wait();
    unsigned long long fault = 0ull;
    for (unsigned i = threadIdx.x; i < slots; i += kThreads) fault = max(fault, a.slots[i]);
    fault = block_max(fault, warp_max);
    if (threadIdx.x == 0) write_error_word(a.v, fault, a.error_word);
}

// CTAs of `kernel` resident at once on the current device (SMs x occupancy), read once per
// device into `cache`: a cooperative launch must not ask for more (a grid barrier would wait
// forever on a CTA that never starts; the launch fails instead).
template <typename Kernel>
cudaError_t resident_ctas(std::atomic<int> (&cache)[kCachedDevices], Kernel kernel, int* ctas) {
    return cached_per_device(cache, ctas, [kernel](int, int* out) -> cudaError_t {
        int sms = 0, per_sm = 0;
        MSA_TRY(current_device_sms(&sms));
        MSA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
        if (per_sm < 1) return cudaErrorCooperativeLaunchTooLarge;
        *out = sms * per_sm;
        return cudaSuccess;
    });
}

std::atomic<int> prepare_resident[kCachedDevices];

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
    char* ws = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
    auto at = [ws](size_t offset) { return static_cast<void*>(ws + offset); };
    PrepareArgs a{};
    a.v = varlen;
    a.zero = static_cast<uint4*>(at(0));
    a.zero_vectors = plan.zeroed_end / sizeof(uint4);  // kAlign-aligned, so whole vectors

    a.bm.words = static_cast<unsigned*>(at(plan.words));
    a.bm.prefix = static_cast<int*>(at(plan.prefix));
    a.bm.levels = plan.levels;
    a.bm.stride = plan.tiles + 1;
    auto* fault = static_cast<unsigned long long*>(at(plan.fault));
    a.sel.topk = topk;
    a.sel.fault = fault;
    a.sel.split_counts = out.split_counts;
    a.sel.tiles = plan.tiles;
    a.sel.ctas = grid_for(static_cast<long long>(kIndexHeads) * plan.tiles * kTileQueries);

    RowTables& rt = a.rt;
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

    OffsetArgs& oa = a.oa;
    oa.fault = fault;
    oa.counts = rt.counts;
    oa.chunks = rt.chunks;
    oa.phys_counts = rt.phys_counts;
    oa.work_offsets = static_cast<int*>(at(plan.work_offsets));
    oa.row_ptr = out.row_ptr;
    oa.phys_row_ptr = out.phys_row_ptr;
    oa.work_count = out.work_count;
    oa.error_word = out.error_word;

    ScatterArgs& sa = a.sa;
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
    sa.query_ctas = a.sel.ctas;
    sa.ctas = a.sel.ctas + grid_for(work_capacity);

    // The widest phase's virtual CTAs, at most what is resident: a tiny call does not start (and
    // wait at every barrier for) hundreds of idle CTAs; the zero phase loops over any grid.
    int resident = 0;
    MSA_TRY(resident_ctas(prepare_resident, prepare_kernel, &resident));
    const unsigned widest = std::max({sa.ctas, unsigned(plan.levels + 1) / 2, unsigned(3 * kIndexHeads)});
    const unsigned grid = std::min(widest, static_cast<unsigned>(resident));
    return launch_cooperative(prepare_kernel, grid, kThreads, static_cast<cudaStream_t>(stream), a);
}

cudaError_t prepare_validate(const int32_t* topk, const MsaVarlen& varlen, int32_t* error_word,
                             int32_t* split_counts, void* workspace, size_t workspace_bytes, void* stream) {
    Plan plan;
    MSA_TRY(make_plan(varlen, &plan));
    if (workspace == nullptr || workspace_bytes < MSA_PREPARE_VALIDATE_WORKSPACE_BYTES || error_word == nullptr ||
        (varlen.total_q > 0 && (topk == nullptr || split_counts == nullptr))) {
        return cudaErrorInvalidValue;
    }
    ValidateArgs a{};
    a.v = varlen;
    a.sel.topk = topk;
    a.sel.split_counts = split_counts;
    a.sel.tiles = plan.tiles;
    a.sel.ctas = grid_for(static_cast<long long>(kIndexHeads) * plan.tiles * kTileQueries);
    a.slots = reinterpret_cast<unsigned long long*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
    a.error_word = error_word;
    const unsigned grid = std::max(1u, std::min(a.sel.ctas, kValidateSlots));
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    MSA_TRY(launch(validate_kernel, grid, kThreads, s, a));
    // The reduction as a programmatic dependent where the device path is sm_90a; stream order elsewhere.
    return dispatch_arch([&] { return launch(validate_reduce_kernel, 1, kThreads, s, a, grid); },
                         [&] { return launch_smem_dependent(validate_reduce_kernel, 1, kThreads, 0, s, a, grid); });
}

}  // namespace
}  // namespace msa

extern "C" int msa_prepare_validate(const int32_t* topk, MsaVarlen varlen, int32_t* error_word,
                                    int32_t* split_counts, void* workspace, size_t workspace_bytes, void* stream) {
    return msa::prepare_validate(topk, varlen, error_word, split_counts, workspace, workspace_bytes, stream);
}

extern "C" int msa_prepare_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    return msa::prepare_workspace_bytes(varlen, bytes);
}

extern "C" int msa_prepare_metadata(const int32_t* topk, MsaVarlen varlen, int32_t target_q_per_cta,
                                    int32_t work_capacity, MsaPrepareOutputs out, void* workspace,
                                    size_t workspace_bytes, void* stream) {
    return msa::prepare_metadata(topk, varlen, target_q_per_cta, work_capacity, out, workspace, workspace_bytes,
                                 stream);
}
