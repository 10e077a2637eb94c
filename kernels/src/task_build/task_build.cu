// Task-build family (kernels/include/msa/task_build.h): NeMo's four task-build kernels, mirrored
// step by step by msa_plan::backward::task_build (same word positions, same -1 fill, same
// integer rules). Atomics are only count/min/max/or, which commute, so the result does not
// depend on scheduling: the bins and tables are deterministic and equal to the host's.

#include "msa/task_build.h"

#include <cuda_runtime.h>

#include <climits>

#include <cub/block/block_scan.cuh>

#include "common/constants.cuh"
#include "common/launch.cuh"

namespace msa {
namespace {

// The ABI words and limits (msa/abi.h, mirrored by msa_plan::backward::{abi, walk}).
constexpr int kDescWords = MSA_DESC_WORDS;
constexpr int kDecWords = MSA_DEC_WORDS;
constexpr int kMetaWords = MSA_META_WORDS;
constexpr int kLocalityWindow = MSA_LOCALITY_WINDOW;
constexpr long long kMaxBins = MSA_MAX_BINS;
constexpr int kWorkWords = MSA_WORK_WORDS;

constexpr int kScanThreads = 1024;  // scan_work, scan_bins: one CTA
constexpr int kScanItems = 8;       // consecutive items per thread and tile
constexpr int kThreads = 256;       // assign_segments, scatter_tables

// Derived sizes and the scratch carve (word offsets).
struct Sizes {
    int rows, edge_capacity, work_capacity, documents, num_sms;
    int capacity, num_windows, num_kblocks, bins;
    size_t task_ends, task_segments, bins_at, task_decode, scratch_words;
    size_t task_qrows, task_qpos, table_words;
};

struct Scratch {
    int* desc;
    int* task_ends;      // [work_capacity]
    int* task_segments;  // [capacity]
    int* counts;         // bins row BIN_COUNTS
    int* first;          // BIN_FIRST_TASKS
    int* last;           // BIN_LAST_TASKS
    int* offsets;        // BIN_OFFSETS
    int* decode;         // [capacity, 3]
};

__device__ __forceinline__ int div_ceil(int a, int b) { return a / b + (a % b != 0 ? 1 : 0); }

// Tasks of one work item: ceil(q_count / 8).
__device__ __forceinline__ int item_tasks(const int* meta, int w) {
    return div_ceil(meta[static_cast<size_t>(w) * kWorkWords + MSA_WORK_Q_COUNT], kTaskQueries);
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: task_ends[w] = sum_{w' <= w} ceil(q_count / 8) for w < num_work; desc[5..7]; bins
// cleared (count 0, first INT32_MAX, last -1). Tiles of 1024 x 8 consecutive items, a block scan
// per tile and a running carry: integer sums, so any tiling gives the host's values.

__global__ void __launch_bounds__(kScanThreads)
    scan_work_kernel(const int* __restrict__ meta, const int* __restrict__ work_count,
                     int work_capacity, int bins, Scratch sc) {
    using Scan = cub::BlockScan<int, kScanThreads>;
    __shared__ typename Scan::TempStorage scan;
    const int n = min(max(*work_count, 0), work_capacity);
    int carry = 0;
    for (int base = 0; base < n; base += kScanThreads * kScanItems) {
        const int first = base + int(threadIdx.x) * kScanItems;
        int inclusive[kScanItems];
        int local = 0;
#pragma unroll
        for (int j = 0; j < kScanItems; ++j) {
            local += first + j < n ? item_tasks(meta, first + j) : 0;
            inclusive[j] = local;
        }
        int before, tile_total;
        Scan(scan).ExclusiveSum(local, before, tile_total);
#pragma unroll
        for (int j = 0; j < kScanItems; ++j) {
            if (first + j < n) sc.task_ends[first + j] = carry + before + inclusive[j];
        }
        carry += tile_total;
        __syncthreads();  // the next tile reuses the scan storage
    }
    if (threadIdx.x == 0) {
        sc.desc[MSA_DESC_NUM_WORK] = n;
        sc.desc[MSA_DESC_NUM_TASKS] = carry;
        sc.desc[MSA_DESC_FLAGS] = 0;
    }
    for (int b = threadIdx.x; b < bins; b += kScanThreads) {
        sc.counts[b] = 0;
        sc.first[b] = INT_MAX;
        sc.last[b] = -1;
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: forward-order task -> (segment, valid, edge_start, doc); segment statistics.

struct AssignArgs {
    MsaTaskBuildInputs in;
    int rows, edge_capacity, capacity, num_windows, num_kblocks;
};

__global__ void __launch_bounds__(kThreads) assign_segments_kernel(AssignArgs a, Scratch sc) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    const int num_tasks = min(sc.desc[MSA_DESC_NUM_TASKS], a.capacity);
    if (thread >= num_tasks) return;
    const int task = int(thread);
    // First work item whose inclusive end passes `task` (items without tasks are skipped).
    int lo = 0, hi = sc.desc[MSA_DESC_NUM_WORK];
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (sc.task_ends[mid] <= task) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    const int w = lo;
    const int* m = a.in.scheduler_metadata + static_cast<size_t>(w) * kWorkWords;
    const int head = m[MSA_WORK_HEAD], row = m[MSA_WORK_ROW], q_begin = m[MSA_WORK_Q_BEGIN];
    const int q_count = m[MSA_WORK_Q_COUNT], doc = m[MSA_WORK_FRAGMENT], kb_local = m[MSA_WORK_KBLOCK];
    const int first_task = sc.task_ends[w] - div_ceil(q_count, kTaskQueries);
    const int query_offset = (task - first_task) * kTaskQueries;
    const int valid = min(q_count - query_offset, kTaskQueries);
    const int edge_start =
        a.in.row_ptr[static_cast<size_t>(head) * (a.rows + 1) + row] + q_begin + query_offset;
    // Slot 0 is always valid and queries ascend inside a bucket: the first query names the window.
    const int first_query =
        a.in.cu_seqlens[doc] + a.in.q_indices[static_cast<size_t>(head) * a.edge_capacity + edge_start];
    const int kblock = a.in.document_workspace_starts[doc] / kBlock + kb_local;
    const int seg = (head * a.num_windows + first_query / kLocalityWindow) * a.num_kblocks + kblock;
    sc.task_segments[task] = seg;
    int* dec = sc.decode + static_cast<size_t>(task) * kDecWords;
    dec[MSA_DEC_VALID] = valid;
    dec[MSA_DEC_EDGE] = edge_start;
    dec[MSA_DEC_DOC] = doc;
    atomicAdd(&sc.counts[seg], 1);
    atomicMin(&sc.first[seg], task);
    atomicMax(&sc.last[seg], task);
}

// ---------------------------------------------------------------------------------------------
// Kernel 3: offsets = exclusive prefix of counts; flag 2 if a non-empty segment is not one
// contiguous run of forward-order tasks.

__global__ void __launch_bounds__(kScanThreads) scan_bins_kernel(int bins, Scratch sc) {
    using Scan = cub::BlockScan<int, kScanThreads>;
    __shared__ typename Scan::TempStorage scan;
    int carry = 0;
    bool noncontiguous = false;
    for (int base = 0; base < bins; base += kScanThreads * kScanItems) {
        const int first = base + int(threadIdx.x) * kScanItems;
        int exclusive[kScanItems];
        int local = 0;
#pragma unroll
        for (int j = 0; j < kScanItems; ++j) {
            exclusive[j] = local;
            const int b = first + j;
            if (b < bins) {
                const int count = sc.counts[b];
                local += count;
                noncontiguous |= count > 0 && sc.last[b] - sc.first[b] + 1 != count;
            }
        }
        int before, tile_total;
        Scan(scan).ExclusiveSum(local, before, tile_total);
#pragma unroll
        for (int j = 0; j < kScanItems; ++j) {
            if (first + j < bins) sc.offsets[first + j] = carry + before + exclusive[j];
        }
        carry += tile_total;
        __syncthreads();
    }
    if (noncontiguous) atomicOr(&sc.desc[MSA_DESC_FLAGS], MSA_FLAG_NONCONTIGUOUS_SEGMENTS);
}

// ---------------------------------------------------------------------------------------------
// Kernel 4: task rows in (head, window, kblock) order (source order under flag 2), and the walk.

struct ScatterArgs {
    MsaTaskBuildInputs in;
    int edge_capacity, capacity, num_windows, num_kblocks, num_sms;
    int* meta;   // [capacity, 4]
    int* qrows;  // [capacity, 8]
    int* qpos;   // [capacity, 8]
};

// msa_plan::backward::walk::{rows_per_cta, chunk_map}: desc[0..5).
__device__ void write_walk(int num_rows, int num_sms, int* desc) {
    const int rpc = num_rows <= MSA_ROWS_PER_CTA_SWITCH ? MSA_ROWS_PER_CTA_SMALL : MSA_ROWS_PER_CTA_LARGE;
    const int num_chunks = div_ceil(num_rows, rpc);
    const int num_full = min((num_chunks / num_sms) * num_sms, num_rows / rpc);
    const int rows_left = num_rows - num_full * rpc;
    int full = num_full, tail = 1, grid = num_full;
    if (rows_left != 0) {
        tail = div_ceil(rows_left, num_sms);
        if (tail < MSA_MIN_TAIL_ROWS) {
            full = 0;
            tail = rpc;
            grid = num_chunks;
        } else {
            grid = num_full + div_ceil(rows_left, tail);
        }
    }
    desc[MSA_DESC_NUM_TASK_ROWS] = num_rows;
    desc[MSA_DESC_ROWS_PER_CTA] = rpc;
    desc[MSA_DESC_NUM_FULL_CTAS] = full;
    desc[MSA_DESC_TAIL_ROWS] = tail;
    desc[MSA_DESC_GRID_CTAS] = grid;
}

__global__ void __launch_bounds__(kThreads) scatter_tables_kernel(ScatterArgs a, Scratch sc) {
    // Past INT32_MAX only in the grid's last block, which holds no task (capacity < 2^31).
    const int task = int(min(static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x,
                             static_cast<long long>(INT_MAX)));
    // Task 0's thread adds only FLAG_CAPACITY_OVERFLOW to this word, so every thread reads the
    // same FLAG_NONCONTIGUOUS_SEGMENTS bit whichever value it sees.
    const int flags = sc.desc[MSA_DESC_FLAGS];
    const int total = sc.desc[MSA_DESC_NUM_TASKS];
    if (task < min(total, a.capacity)) {
        const int seg = sc.task_segments[task];
        const int row =
            (flags & MSA_FLAG_NONCONTIGUOUS_SEGMENTS) ? task : sc.offsets[seg] + task - sc.first[seg];
        const int kblock = seg % a.num_kblocks;
        const int head = seg / a.num_kblocks / a.num_windows;
        const int* dec = sc.decode + static_cast<size_t>(task) * kDecWords;
        const int valid = dec[MSA_DEC_VALID], edge = dec[MSA_DEC_EDGE], doc = dec[MSA_DEC_DOC];
        static_assert(MSA_META_WORDS == 4 && MSA_META_BATCH == 0 && MSA_META_HEAD == 1 &&
                          MSA_META_KBLOCK == 2 && MSA_META_VALID == 3,
                      "one int4 store writes the meta row (0, head, kblock, valid)");
        reinterpret_cast<int4*>(a.meta)[row] = make_int4(0, head, kblock, valid);
        const int cu = a.in.cu_seqlens[doc];
        const int pos_base = a.in.document_workspace_starts[doc] + a.in.query_offsets[doc];
        const int* queries = a.in.q_indices + static_cast<size_t>(head) * a.edge_capacity + edge;
        static_assert(kTaskQueries == 8, "two int4 stores write a task row's 8 slots");
        int qr[kTaskQueries], qp[kTaskQueries];
#pragma unroll
        for (int s = 0; s < kTaskQueries; ++s) {
            const int q = s < valid ? queries[s] : 0;
            qr[s] = s < valid ? cu + q : -1;
            qp[s] = s < valid ? pos_base + q : -1;
        }
        int4* qrows = reinterpret_cast<int4*>(a.qrows) + static_cast<size_t>(row) * 2;
        int4* qpos = reinterpret_cast<int4*>(a.qpos) + static_cast<size_t>(row) * 2;
        qrows[0] = make_int4(qr[0], qr[1], qr[2], qr[3]);
        qrows[1] = make_int4(qr[4], qr[5], qr[6], qr[7]);
        qpos[0] = make_int4(qp[0], qp[1], qp[2], qp[3]);
        qpos[1] = make_int4(qp[4], qp[5], qp[6], qp[7]);
    }
    if (task == 0) {
        // Overflow: a contract violation; no CTA walks (zero gradients) and flag 1 says why.
        const bool overflow = total > a.capacity;
        write_walk(overflow ? 0 : total, a.num_sms, sc.desc);
        if (overflow) sc.desc[MSA_DESC_FLAGS] = flags | MSA_FLAG_CAPACITY_OVERFLOW;
    }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// msa_plan::task_build_sizes; false for a shape the planner rejects.
bool derive_sizes(const MsaTaskBuildShape& s, Sizes* z) {
    if (s.rows < 1 || s.edge_capacity < 1 || s.work_capacity < 1 || s.documents < 1 ||
        s.num_tokens < 0 || s.workspace_rows < 0 || s.workspace_rows % kBlock != 0 ||
        s.num_sms < 1) {
        return false;
    }
    const long long capacity =
        static_cast<long long>(kIndexHeads) * s.edge_capacity / kTaskQueries + s.work_capacity;
    const long long windows = (static_cast<long long>(s.num_tokens) + kLocalityWindow - 1) / kLocalityWindow;
    const long long kblocks = s.workspace_rows / kBlock;
    const long long bins = kIndexHeads * windows * (kblocks > 1 ? kblocks : 1);
    if (bins > kMaxBins || capacity > INT_MAX) return false;
    const long long scratch =
        kDescWords + s.work_capacity + capacity + MSA_BIN_ROWS * bins + kDecWords * capacity;
    const long long tables = capacity * (kMetaWords + 2 * kTaskQueries);
    if (scratch > INT_MAX || tables > INT_MAX) return false;
    z->rows = s.rows;
    z->edge_capacity = s.edge_capacity;
    z->work_capacity = s.work_capacity;
    z->documents = s.documents;
    z->num_sms = s.num_sms;
    z->capacity = int(capacity);
    z->num_windows = int(windows);
    z->num_kblocks = int(kblocks);
    z->bins = int(bins);
    z->task_ends = kDescWords;
    z->task_segments = z->task_ends + size_t(s.work_capacity);
    z->bins_at = z->task_segments + size_t(capacity);
    z->task_decode = z->bins_at + MSA_BIN_ROWS * size_t(bins);
    z->scratch_words = size_t(scratch);
    z->task_qrows = size_t(capacity) * kMetaWords;
    z->task_qpos = z->task_qrows + size_t(capacity) * kTaskQueries;
    z->table_words = size_t(tables);
    return true;
}

// The four launches after the -1 fill (sizes checked first: nothing is enqueued otherwise).
cudaError_t task_build_tables(const MsaTaskBuildInputs& inputs, const MsaTaskBuildShape& shape, int32_t* scratch,
                              size_t scratch_words, int32_t* tables, size_t table_words, void* stream) {
    Sizes z;
    if (!derive_sizes(shape, &z) || scratch == nullptr || tables == nullptr ||
        scratch_words != z.scratch_words || table_words != z.table_words ||
        !aligned16(tables)) {
        return cudaErrorInvalidValue;
    }
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    MSA_TRY(cudaMemsetAsync(scratch, 0xFF, scratch_words * sizeof(int32_t), s));
    MSA_TRY(cudaMemsetAsync(tables, 0xFF, table_words * sizeof(int32_t), s));

    Scratch sc;
    sc.desc = scratch;
    sc.task_ends = scratch + z.task_ends;
    sc.task_segments = scratch + z.task_segments;
    sc.counts = scratch + z.bins_at + MSA_BIN_COUNTS * z.bins;
    sc.first = scratch + z.bins_at + MSA_BIN_FIRST_TASKS * z.bins;
    sc.last = scratch + z.bins_at + MSA_BIN_LAST_TASKS * z.bins;
    sc.offsets = scratch + z.bins_at + MSA_BIN_OFFSETS * z.bins;
    sc.decode = scratch + z.task_decode;

    MSA_TRY(launch(scan_work_kernel, 1, kScanThreads, s, inputs.scheduler_metadata, inputs.work_count,
                   z.work_capacity, z.bins, sc));

    const unsigned task_grid = unsigned((z.capacity + kThreads - 1) / kThreads);
    AssignArgs aa;
    aa.in = inputs;
    aa.rows = z.rows;
    aa.edge_capacity = z.edge_capacity;
    aa.capacity = z.capacity;
    aa.num_windows = z.num_windows;
    aa.num_kblocks = z.num_kblocks;
    MSA_TRY(launch(assign_segments_kernel, task_grid, kThreads, s, aa, sc));

    MSA_TRY(launch(scan_bins_kernel, 1, kScanThreads, s, z.bins, sc));

    ScatterArgs sa;
    sa.in = inputs;
    sa.edge_capacity = z.edge_capacity;
    sa.capacity = z.capacity;
    sa.num_windows = z.num_windows;
    sa.num_kblocks = z.num_kblocks;
    sa.num_sms = z.num_sms;
    sa.meta = tables;
    sa.qrows = tables + z.task_qrows;
    sa.qpos = tables + z.task_qpos;
    return launch(scatter_tables_kernel, task_grid, kThreads, s, sa, sc);
}

}  // namespace
}  // namespace msa

extern "C" int msa_task_build_tables(MsaTaskBuildInputs inputs, MsaTaskBuildShape shape, int32_t* scratch,
                                     size_t scratch_words, int32_t* tables, size_t table_words, void* stream) {
    return msa::task_build_tables(inputs, shape, scratch, scratch_words, tables, table_words, stream);
}
