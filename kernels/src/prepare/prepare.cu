// Prepare family (kernels/include/msa/prepare.h): top-k validation, k2q CSR, work list and
// physical CSR of one selection, equal word for word to msa_plan's host tables.
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

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/constants.cuh"
#include "common/launch.cuh"
#include "common/varlen.cuh"

namespace {

using msa::kBlock;
using msa::kIndexHeads;  // index heads = KV groups
using msa::kTopK;        // slots per (head, query)
constexpr int kWorkWords = MSA_WORK_WORDS;  // scheduler_metadata row
using msa::kPhysRankShift;
using msa::kQsplitRankShift;
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
    const msa::FragmentCoord c = msa::fragment_coord(v, b);
    return Frag{c.q_start, c.q_len, c.k_len, c.num_blocks(), c.phys_base()};
}

// ---------------------------------------------------------------------------------------------
// Row map. Row (b, L) = sum_b' min(nb_b', L) + #{b' < b : nb_b' > L} (level-major, as
// msa_plan::layout). One CTA per level L: a block reduce gives the first term, a block scan over
// fragments the second; the same scan over nb gives row_offsets[b] = sum_{b' < b} nb_b', the
// start of fragment b in the compact (fragment, level) -> row table.

struct RowMapOut {
    int* row_offsets;  // [B + 1]
    int* row_map;      // [R]: row of (b, L) at row_offsets[b] + L
    int* row_frag;     // [R]: fragment of each row
    int* row_level;    // [R]: level of each row
    int* doc_ws;       // [B]: document_workspace_starts
    int* doc_qoff;     // [B]: query_offsets
};

__global__ void __launch_bounds__(kRowMapThreads) row_map_kernel(MsaVarlen v, RowMapOut o) {
    using Scan = cub::BlockScan<int, kRowMapThreads>;
    using Reduce = cub::BlockReduce<int, kRowMapThreads>;
    __shared__ union {
        typename Reduce::TempStorage reduce;
        typename Scan::TempStorage scan[2];
    } smem;
    __shared__ int rows_before;
    const int level = blockIdx.x;

    int below = 0;
    for (int b = threadIdx.x; b < v.batch; b += kRowMapThreads) {
        below += min(fragment(v, b).num_blocks, level);
    }
    const int total_below = Reduce(smem.reduce).Sum(below);
    if (threadIdx.x == 0) rows_before = total_below;
    __syncthreads();
    const int base_row = rows_before;

    int active_carry = 0;
    int offset_carry = 0;
    for (int tile = 0; tile < v.batch; tile += kRowMapThreads) {
        const int b = tile + threadIdx.x;
        Frag f{};
        if (b < v.batch) f = fragment(v, b);
        const int active = f.num_blocks > level ? 1 : 0;
        int active_before, active_total, offset, offset_total;
        Scan(smem.scan[0]).ExclusiveSum(active, active_before, active_total);
        Scan(smem.scan[1]).ExclusiveSum(f.num_blocks, offset, offset_total);
        offset += offset_carry;
        if (active) {
            const int row = base_row + active_carry + active_before;
            o.row_map[offset + level] = row;
            o.row_frag[row] = b;
            o.row_level[row] = level;
        }
        if (level == 0 && b < v.batch) {
            o.row_offsets[b] = offset;
            o.doc_ws[b] = f.phys_base * kBlock;
            o.doc_qoff[b] = f.k_len - f.q_len;
        }
        active_carry += active_total;
        offset_carry += offset_total;
        __syncthreads();  // the next tile reuses the scan storage
    }
    if (level == 0 && threadIdx.x == 0) o.row_offsets[v.batch] = offset_carry;
}

// ---------------------------------------------------------------------------------------------
// Edges. Thread lin = (head*T + q)*16 + slot owns one top-k entry; the 16 lanes of a half warp
// hold one (head, q) row, so the whole row is visible through shuffles. N = 64*T is a multiple
// of 16, so a half warp is entirely live or entirely past N (dead lanes still shuffle).

struct EdgeOut {
    unsigned long long* fault;  // min over faults of lin << 8 | code
    int* split_counts;          // [T, 4]
    unsigned* k2q_keys;         // [N]: head*R + row, or 4R (sorts last) for a non-edge
    unsigned* k2q_vals;         // [N]: q_local | rank << 24
    int* k2q_counts;            // [4R + 1]
    unsigned* phys_keys;        // [N]: head*P + physical block, or 4P
    unsigned long long* phys_vals;  // [N]: q << 32 | visible | rank << 8
    int* phys_counts;           // [4P + 1]
    const int* row_offsets;     // from row_map_kernel
    const int* row_map;
};

// msa_plan::topk::entry_code; `dup` = an earlier slot of the row holds the same value.
__device__ __forceinline__ int entry_code(int value, bool dup, int own_block, int num_blocks) {
    if (value == MSA_TOPK_PADDING) return MSA_TOPK_OK;
    if (value < 0) return MSA_TOPK_NEGATIVE;
    if (value >= num_blocks) return MSA_TOPK_OUT_OF_RANGE;
    if (value > own_block) return MSA_TOPK_NON_CAUSAL;
    if (dup) return MSA_TOPK_DUPLICATE;
    return MSA_TOPK_OK;
}

__global__ void __launch_bounds__(kThreads) edge_kernel(const int* __restrict__ topk, MsaVarlen v,
                                                        EdgeOut o) {
    const unsigned n = unsigned(kEdgesPerQuery) * unsigned(v.total_q);
    const unsigned lin = blockIdx.x * unsigned(kThreads) + threadIdx.x;
    const bool live = lin < n;
    const int slot = int(lin & 15u);
    const int lane = int(threadIdx.x & 31u);

    int head = 0, q = 0, b = 0, value = -1, q_local = 0, pos = 0;
    Frag f{};
    if (live) {
        const int hq = int(lin >> 4);
        head = hq / v.total_q;
        q = hq - head * v.total_q;
        value = topk[lin];
        b = v.query_fragment[q];
        f = fragment(v, b);
        q_local = q - f.q_start;
        pos = f.k_len - f.q_len + q_local;
    }
    const int nb = f.num_blocks;  // 0 for dead lanes: nothing is valid there
    const bool valid = value >= 0 && value < nb;

    // Writer rank: valid entries of the row with a smaller block id (duplicates share a rank,
    // as msa_plan::csr::query_edges). dup: the same value in an earlier slot.
    int rank = 0;
    bool dup = false;
#pragma unroll
    for (int j = 0; j < kTopK; ++j) {
        const int other = __shfl_sync(kFullMask, value, j, kTopK);
        rank += (other >= 0 && other < nb && other < value) ? 1 : 0;
        dup |= (j < slot && other == value);
    }
    const unsigned valid_mask = __ballot_sync(kFullMask, valid);
    const int code = live ? entry_code(value, dup, pos / kBlock, nb) : 0;
    const unsigned faults = __ballot_sync(kFullMask, code != 0);
    // Lanes of a warp hold consecutive lin, so the lowest faulting lane has the warp's minimum.
    if (faults != 0u && lane == __ffs(int(faults)) - 1) {
        atomicMin(o.fault, (static_cast<unsigned long long>(lin) << 8) | unsigned(code));
    }
    if (!live) return;

    const int R = v.total_rows;
    const int P = v.padded_kv_blocks;
    if (slot == 0) {
        o.split_counts[q * kIndexHeads + head] = __popc((valid_mask >> (lane & 16)) & 0xffffu);
    }
    if (valid) {
        const int row = o.row_map[o.row_offsets[b] + value];
        const int k2q_key = head * R + row;
        o.k2q_keys[lin] = unsigned(k2q_key);
        o.k2q_vals[lin] = unsigned(q_local) | (unsigned(rank) << kQsplitRankShift);
        atomicAdd(&o.k2q_counts[k2q_key], 1);

        const int block_keys = min(f.k_len - value * kBlock, kBlock);
        const int visible = min(block_keys, max(0, pos + 1 - value * kBlock));
        const int phys_key = head * P + f.phys_base + value;
        o.phys_keys[lin] = unsigned(phys_key);
        o.phys_vals[lin] = (static_cast<unsigned long long>(unsigned(q)) << 32) |
                           unsigned(visible | (rank << kPhysRankShift));
        atomicAdd(&o.phys_counts[phys_key], 1);
    } else {
        o.k2q_keys[lin] = unsigned(kIndexHeads * R);
        o.k2q_vals[lin] = 0u;
        o.phys_keys[lin] = unsigned(kIndexHeads * P);
        o.phys_vals[lin] = 0ull;
    }
}

__global__ void error_word_kernel(const unsigned long long* fault, int total_q, int* word) {
    const unsigned long long f = *fault;
    if (f == kNoFault) {
        word[0] = word[1] = word[2] = word[3] = 0;
        return;
    }
    const unsigned lin = unsigned(f >> 8);
    const int hq = int(lin >> 4);
    const int head = hq / total_q;
    word[0] = int(f & 0xffu);
    word[1] = head;
    word[2] = hq - head * total_q;
    word[3] = int(lin & 15u);
}

// ---------------------------------------------------------------------------------------------
// Offsets: row_ptr[h, r] = G[h*R + r] - G[h*R] from the exclusive scan G of the per-(head, row)
// counts (G has 4R + 1 entries, so r = R reads the next head's start or the total); likewise
// for the physical CSR. chunks[h*R + r] = ceil(count / target), chunks[4R] = 0.

struct OffsetsArgs {
    const int* k2q_counts;
    const int* k2q_offsets;
    const int* phys_offsets;
    int* row_ptr;
    int* phys_row_ptr;
    int* chunk_counts;
    int target;
};

__global__ void __launch_bounds__(kThreads) offsets_kernel(MsaVarlen v, OffsetsArgs a) {
    const int R = v.total_rows;
    const int P = v.padded_kv_blocks;
    const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (i < static_cast<long long>(kIndexHeads) * (R + 1)) {
        const int h = int(i / (R + 1));
        const int r = int(i - static_cast<long long>(h) * (R + 1));
        a.row_ptr[i] = a.k2q_offsets[h * R + r] - a.k2q_offsets[h * R];
    }
    if (i <= static_cast<long long>(kIndexHeads) * R) {
        a.chunk_counts[i] =
            i < static_cast<long long>(kIndexHeads) * R ? (a.k2q_counts[i] + a.target - 1) / a.target : 0;
    }
    if (i < static_cast<long long>(kIndexHeads) * (P + 1)) {
        const int h = int(i / (P + 1));
        const int r = int(i - static_cast<long long>(h) * (P + 1));
        a.phys_row_ptr[i] = a.phys_offsets[h * P + r] - a.phys_offsets[h * P];
    }
}

// ---------------------------------------------------------------------------------------------
// Work items: item i belongs to the (head, row) k with W[k] <= i < W[k + 1] (W = exclusive scan
// of chunks, 4R + 1 entries), chunk c = i - W[k]; the scan order is head-major then row, so the
// items come out in msa_plan::schedule::build_work_items order. Rows past the items are 0.

struct WorkArgs {
    const int* k2q_counts;
    const int* work_offsets;
    const int* row_frag;
    const int* row_level;
    int* meta;
    int* work_count;
    int target;
    int capacity;
};

__global__ void __launch_bounds__(kThreads) work_kernel(MsaVarlen v, WorkArgs a) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (thread >= a.capacity) return;
    const int i = int(thread);
    const int R = v.total_rows;
    const int keys = kIndexHeads * R;  // W has keys + 1 entries
    const int total = a.work_offsets[keys];
    if (i == 0) *a.work_count = total;
    int words[kWorkWords] = {};
    if (i < total) {
        // Last k with W[k] <= i: rows without chunks share their successor's offset and are
        // skipped because W[k + 1] > i.
        int lo = 0, hi = keys;  // invariant: W[lo] <= i < W[hi]
        while (hi - lo > 1) {
            const int mid = lo + (hi - lo) / 2;
            if (a.work_offsets[mid] <= i) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const int head = lo / R;
        const int row = lo - head * R;
        const int q_begin = (i - a.work_offsets[lo]) * a.target;
        words[MSA_WORK_HEAD] = head;
        words[MSA_WORK_ROW] = row;
        words[MSA_WORK_Q_BEGIN] = q_begin;
        words[MSA_WORK_Q_COUNT] = min(a.target, a.k2q_counts[lo] - q_begin);
        words[MSA_WORK_FRAGMENT] = a.row_frag[row];
        words[MSA_WORK_KBLOCK] = a.row_level[row];
    }
    int* out = a.meta + static_cast<size_t>(i) * kWorkWords;
#pragma unroll
    for (int w = 0; w < kWorkWords; ++w) out[w] = words[w];
}

// ---------------------------------------------------------------------------------------------
// Scatters of the sorted edges. Sorted position p of key k (head h) lands at p - G[h*rows] in
// head h's edge slots: G[h*rows] counts the edges of earlier heads, and within a head the sorted
// order is row-major with stable (query, slot) order inside a row. Sentinel keys sort last.

__global__ void __launch_bounds__(kThreads)
    scatter_k2q_kernel(const unsigned* __restrict__ keys, const unsigned* __restrict__ vals,
                       const int* __restrict__ offsets, int rows, int n, int* q_indices,
                       int* qsplit) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (thread >= n) return;
    const int p = int(thread);
    const unsigned key = keys[p];
    if (key >= unsigned(kIndexHeads * rows)) return;
    const int head = int(key) / rows;
    const size_t at = static_cast<size_t>(head) * (n / kIndexHeads) + (p - offsets[head * rows]);
    const unsigned val = vals[p];
    q_indices[at] = int(val & ((1u << kQsplitRankShift) - 1u));
    qsplit[at] = int(val);
}

__global__ void __launch_bounds__(kThreads)
    scatter_phys_kernel(const unsigned* __restrict__ keys,
                        const unsigned long long* __restrict__ vals,
                        const int* __restrict__ offsets, int blocks, int n, int* phys_q,
                        int* phys_valid) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (thread >= n) return;
    const int p = int(thread);
    const unsigned key = keys[p];
    if (key >= unsigned(kIndexHeads * blocks)) return;
    const int head = int(key) / blocks;
    const size_t at = static_cast<size_t>(head) * (n / kIndexHeads) + (p - offsets[head * blocks]);
    const unsigned long long val = vals[p];
    phys_q[at] = int(unsigned(val >> 32));
    phys_valid[at] = int(unsigned(val & 0xffffffffull));
}

// ---------------------------------------------------------------------------------------------
// Host side: sizes, workspace carve, launches.

constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Bits that hold every key in [0, sentinel]: the radix sort skips the zero high bits.
int key_bits(unsigned sentinel) {
    int bits = 1;
    while (bits < 32 && (sentinel >> bits) != 0u) ++bits;
    return bits;
}

struct Plan {
    // Sizes.
    int n_edges;  // 64 * T (kEdgesPerQuery per query)
    int k2q_keys;  // 4R: sentinel and scan length - 1
    int phys_keys; // 4P
    // Byte offsets into the workspace.
    size_t fault, row_offsets, row_map, row_frag, row_level;
    size_t k2q_counts, k2q_offsets, chunk_counts, work_offsets, phys_counts, phys_offsets;
    size_t k2q_keys_a, k2q_vals_a, phys_keys_a, phys_vals_a, keys_b, vals_b;
    size_t temp, temp_bytes, total;
};

struct Carver {
    size_t at = 0;
    template <typename T>
    size_t take(size_t count) {
        const size_t here = at;
        at = align_up(at + count * sizeof(T));
        return here;
    }
};

// Checks the sizes, asks CUB for its temporary storage and lays the workspace out; the same
// function serves msa_prepare_workspace_bytes and the launcher, so they always agree.
cudaError_t make_plan(const MsaVarlen& v, Plan* p) {
    const long long t = v.total_q, r = v.total_rows, pb = v.padded_kv_blocks, b = v.batch;
    if (t < 0 || r < 0 || pb < 1 || b < 1 || kEdgesPerQuery * t > INT32_MAX || kIndexHeads * (r + 1) > INT32_MAX ||
        kIndexHeads * (pb + 1) > INT32_MAX || (t > 0 && r < 1)) {
        return cudaErrorInvalidValue;
    }
    p->n_edges = int(kEdgesPerQuery * t);
    p->k2q_keys = int(kIndexHeads * r);
    p->phys_keys = int(kIndexHeads * pb);
    const size_t n = size_t(p->n_edges);
    Carver c;
    p->fault = c.take<unsigned long long>(1);
    p->row_offsets = c.take<int>(size_t(b) + 1);
    p->row_map = c.take<int>(size_t(r));
    p->row_frag = c.take<int>(size_t(r));
    p->row_level = c.take<int>(size_t(r));
    p->k2q_counts = c.take<int>(size_t(p->k2q_keys) + 1);
    p->k2q_offsets = c.take<int>(size_t(p->k2q_keys) + 1);
    p->chunk_counts = c.take<int>(size_t(p->k2q_keys) + 1);
    p->work_offsets = c.take<int>(size_t(p->k2q_keys) + 1);
    p->phys_counts = c.take<int>(size_t(p->phys_keys) + 1);
    p->phys_offsets = c.take<int>(size_t(p->phys_keys) + 1);
    p->k2q_keys_a = c.take<unsigned>(n);
    p->k2q_vals_a = c.take<unsigned>(n);
    p->phys_keys_a = c.take<unsigned>(n);
    p->phys_vals_a = c.take<unsigned long long>(n);
    // The second buffers of both double-buffered sorts (the k2q sort runs first and its result
    // is scattered before the physical sort reuses them).
    p->keys_b = c.take<unsigned>(n);
    p->vals_b = c.take<unsigned long long>(n);
    p->temp = c.at;

    size_t temp = 0, bytes = 0;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int*>(nullptr),
                                          static_cast<int*>(nullptr), p->k2q_keys + 1));
    temp = bytes > temp ? bytes : temp;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int*>(nullptr),
                                          static_cast<int*>(nullptr), p->phys_keys + 1));
    temp = bytes > temp ? bytes : temp;
    if (p->n_edges > 0) {
        cub::DoubleBuffer<unsigned> keys(nullptr, nullptr);
        cub::DoubleBuffer<unsigned> vals32(nullptr, nullptr);
        cub::DoubleBuffer<unsigned long long> vals64(nullptr, nullptr);
        MSA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals32, p->n_edges, 0,
                                                key_bits(unsigned(p->k2q_keys))));
        temp = bytes > temp ? bytes : temp;
        MSA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals64, p->n_edges, 0,
                                                key_bits(unsigned(p->phys_keys))));
        temp = bytes > temp ? bytes : temp;
    }
    p->temp_bytes = temp;
    // kAlign bytes of slack: the launcher aligns the workspace base up, so any allocation works.
    p->total = align_up(p->temp + temp) + kAlign;
    return cudaSuccess;
}

unsigned grid_for(long long items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace

extern "C" int msa_prepare_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    if (bytes == nullptr) return cudaErrorInvalidValue;
    Plan plan;
    MSA_TRY(make_plan(varlen, &plan));
    *bytes = plan.total;
    return cudaSuccess;
}

extern "C" int msa_prepare_metadata(const int32_t* topk, MsaVarlen varlen,
                                    int32_t target_q_per_cta, int32_t work_capacity,
                                    MsaPrepareOutputs out, void* workspace,
                                    size_t workspace_bytes, void* stream) {
    Plan plan;
    MSA_TRY(make_plan(varlen, &plan));
    if (target_q_per_cta <= 0 || target_q_per_cta % 8 != 0 || work_capacity < 1 ||
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
    MSA_TRY(msa::launch(row_map_kernel, levels, kRowMapThreads, s, varlen, rm));

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
        MSA_TRY(msa::launch(edge_kernel, grid_for(plan.n_edges), kThreads, s, topk, varlen, eo));
    }
    MSA_TRY(msa::launch(error_word_kernel, 1, 1, s, fault, varlen.total_q, out.error_word));

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
    MSA_TRY(msa::launch(offsets_kernel, grid_for(offset_items), kThreads, s, varlen, oa));

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
    MSA_TRY(msa::launch(work_kernel, grid_for(work_capacity), kThreads, s, varlen, wa));

    if (n > 0) {
        cub::DoubleBuffer<unsigned> keys(k2q_keys_a, keys_b);
        cub::DoubleBuffer<unsigned> vals32(k2q_vals_a, reinterpret_cast<unsigned*>(vals_b));
        temp_bytes = plan.temp_bytes;
        MSA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, vals32, plan.n_edges, 0,
                                                key_bits(unsigned(plan.k2q_keys)), s));
        MSA_TRY(msa::launch(scatter_k2q_kernel, grid_for(plan.n_edges), kThreads, s, keys.Current(),
                            vals32.Current(), k2q_offsets, varlen.total_rows, plan.n_edges,
                            out.q_indices, out.qsplit));

        cub::DoubleBuffer<unsigned> pkeys(phys_keys_a, keys_b);
        cub::DoubleBuffer<unsigned long long> vals64(phys_vals_a, vals_b);
        temp_bytes = plan.temp_bytes;
        MSA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, pkeys, vals64, plan.n_edges, 0,
                                                key_bits(unsigned(plan.phys_keys)), s));
        MSA_TRY(msa::launch(scatter_phys_kernel, grid_for(plan.n_edges), kThreads, s,
                            pkeys.Current(), vals64.Current(), phys_offsets,
                            varlen.padded_kv_blocks, plan.n_edges, out.phys_q_indices,
                            out.phys_valid));
    }
    return cudaSuccess;
}
