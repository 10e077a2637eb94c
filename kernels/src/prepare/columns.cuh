// Prepare: the bitmap's column prefixes and the rows of each level (the level-major row map of
// msa_plan::layout) with their edge counts, one CTA per level; then every offset of the tables
// (k2q row_ptr, phys_row_ptr, the work-item offsets) and the error word, one CTA.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

struct RowTables {
    int* phys_counts;  // [4, P]: edges per (head, physical block) (zeroed per call)
    int* row_offsets;  // [B + 1]: start of fragment b in the (fragment, level) -> row map
    int* row_map;      // [R]: row of (b, L) at row_offsets[b] + L
    int* row_frag;     // [R]
    int* row_level;    // [R]
    int* counts;       // [4, R]: edges of each (head, row)
    int* chunks;       // [4, R]: ceil(count / target)
    int* row_first;    // [4, R]: set bits of the row's column before the fragment's queries
    int* phys_shift;   // [4, R]: edges of the block from the document's earlier fragments,
                       //         minus row_first
    int* doc_ws;       // [B]: document_workspace_starts
    int* doc_qoff;     // [B]: query_offsets
    int target;
};

using LevelScan = cub::BlockScan<int, kThreads>;
using LevelReduce = cub::BlockReduce<int, kThreads>;

// Exclusive prefix of the set bits of one column, by one warp: lane l takes `per` consecutive
// words, a warp scan of the lanes' sums, then each lane writes its words' prefixes.
__device__ __forceinline__ void column_prefix(const Bitmap& bm, size_t col, int lane) {
    const int per = (bm.stride + 31) / 32;
    const int begin = min(lane * per, bm.stride);
    const int end = min(begin + per, bm.stride);
    int sum = 0;
    for (int w = begin; w < end; ++w) sum += __popc(bm.words[col + w]);
    int before = sum;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const int other = __shfl_up_sync(kFullMask, before, d);
        if (lane >= d) before += other;
    }
    before -= sum;
    for (int w = begin; w < end; ++w) {
        bm.prefix[col + w] = before;
        before += __popc(bm.words[col + w]);
    }
}

// CTA L: the prefixes of columns (h, L), then the rows (b, L) for every fragment with
// nb_b > L: row = sum_b' min(nb_b', L) + #{b' < b : nb_b' > L} (msa_plan::layout), and per head
// the row's edges = the column's bits in the fragment's query range. A physical block's earlier
// edges come from the document's earlier fragments (fragments of a document share its blocks;
// packed order = ascending queries): from shared memory within the tile of 256 fragments,
// from the bitmap for fragments of earlier tiles.
__global__ void __launch_bounds__(kThreads) level_kernel(MsaVarlen v, Bitmap bm, RowTables o) {
    __shared__ union {
        typename LevelReduce::TempStorage reduce;
        typename LevelScan::TempStorage scan[2];
    } smem;
    __shared__ int rows_before;
    __shared__ int tile_first[kThreads];
    __shared__ int tile_count[kIndexHeads][kThreads];
    const int level = blockIdx.x;
    const int warp = int(threadIdx.x / 32u);
    const int lane = int(threadIdx.x % 32u);
    if (warp < kIndexHeads) column_prefix(bm, bm.column(warp, level), lane);

    int below = 0;
    for (int b = threadIdx.x; b < v.batch; b += kThreads) below += min(fragment(v, b).num_blocks, level);
    const int total_below = LevelReduce(smem.reduce).Sum(below);
    if (threadIdx.x == 0) rows_before = total_below;
    __syncthreads();  // also publishes the column prefixes
    const int base_row = rows_before;
    const int R = v.total_rows;
    int active_carry = 0;
    int offset_carry = 0;
    for (int tile = 0; tile < v.batch; tile += kThreads) {
        const int b = tile + int(threadIdx.x);
        Frag f{};
        if (b < v.batch) f = fragment(v, b);
        const int active = f.num_blocks > level ? 1 : 0;
        int active_before, active_total, offset, offset_total;
        LevelScan(smem.scan[0]).ExclusiveSum(active, active_before, active_total);
        LevelScan(smem.scan[1]).ExclusiveSum(f.num_blocks, offset, offset_total);
        offset += offset_carry;
        int bits_before[kIndexHeads] = {}, count[kIndexHeads] = {};
        if (active) {
#pragma unroll
            for (int h = 0; h < kIndexHeads; ++h) {
                const size_t col = bm.column(h, level);
                bits_before[h] = bm.before(col, f.q_start);
                count[h] = bm.before(col, f.q_start + f.q_len) - bits_before[h];
            }
        }
        tile_first[threadIdx.x] = b < v.batch ? f.first : -1;
#pragma unroll
        for (int h = 0; h < kIndexHeads; ++h) tile_count[h][threadIdx.x] = count[h];
        __syncthreads();  // the tile's counts are visible
        if (active) {
            const int row = base_row + active_carry + active_before;
            o.row_map[offset + level] = row;
            o.row_frag[row] = b;
            o.row_level[row] = level;
            int earlier[kIndexHeads] = {};
            for (int e = max(f.first, tile); e < b; ++e) {
                if (tile_first[e - tile] != f.first) continue;
#pragma unroll
                for (int h = 0; h < kIndexHeads; ++h) earlier[h] += tile_count[h][e - tile];
            }
            for (int e = f.first; e < tile; ++e) {  // a document spanning tiles (B > 256)
                if (v.fragment_first[e] != f.first) continue;
                const int qs = v.cu_seqlens_q[e], qe = v.cu_seqlens_q[e + 1];
#pragma unroll
                for (int h = 0; h < kIndexHeads; ++h) {
                    const size_t col = bm.column(h, level);
                    earlier[h] += bm.before(col, qe) - bm.before(col, qs);
                }
            }
            const int pb = f.phys_base + level;
#pragma unroll
            for (int h = 0; h < kIndexHeads; ++h) {
                const size_t at = static_cast<size_t>(h) * R + row;
                o.counts[at] = count[h];
                o.chunks[at] = (count[h] + o.target - 1) / o.target;
                o.row_first[at] = bits_before[h];
                o.phys_shift[at] = earlier[h] - bits_before[h];
                if (count[h] > 0 && pb < v.padded_kv_blocks) {
                    atomicAdd(&o.phys_counts[static_cast<size_t>(h) * v.padded_kv_blocks + pb], count[h]);
                }
            }
        }
        if (level == 0 && b < v.batch) {
            o.row_offsets[b] = offset;
            o.doc_ws[b] = f.phys_base * kBlock;
            o.doc_qoff[b] = f.k_len - f.q_len;
        }
        active_carry += active_total;
        offset_carry += offset_total;
        __syncthreads();  // the next tile reuses the scan storage and the tile arrays
    }
    if (level == 0 && threadIdx.x == 0) o.row_offsets[v.batch] = offset_carry;
}

struct OffsetArgs {
    const unsigned long long* fault;  // from select_kernel
    const int* counts;
    const int* chunks;
    const int* phys_counts;
    int* work_offsets;  // [4R + 1]: exclusive scan of chunks
    int* row_ptr;       // [4, R + 1]
    int* phys_row_ptr;  // [4, P + 1]
    int* work_count;    // [1]
    int* error_word;    // [4]
};

using OffsetScan = cub::BlockScan<int, kOffsetThreads>;

// One CTA's exclusive scan of the 4 head segments of in[4 * len]: per_head[h * (len + 1) + r] =
// the sum of in[h * len .. h * len + r) (r = len: the head's total). When flat_in is given, the
// same pass scans flat_in[4 * len] without head breaks into flat_out[0, 4 len] and returns its
// total. kOffsetItems consecutive items per thread per pass.
__device__ int scan_by_head(const int* in, int len, int* per_head, const int* flat_in, int* flat_out,
                            typename OffsetScan::TempStorage (&storage)[2], int* head_base) {
    const int n = kIndexHeads * len;
    int carry = 0, flat_carry = 0;
    for (int tile = 0; tile < n; tile += kOffsetThreads * kOffsetItems) {
        const int first = tile + int(threadIdx.x) * kOffsetItems;
        int items[kOffsetItems], flat[kOffsetItems];
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const bool in_range = first + j < n;
            items[j] = in_range ? in[first + j] : 0;
            flat[j] = in_range && flat_in != nullptr ? flat_in[first + j] : 0;
        }
        int total, flat_total;
        OffsetScan(storage[0]).ExclusiveSum(items, items, total);
        OffsetScan(storage[1]).ExclusiveSum(flat, flat, flat_total);
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int i = first + j;
            if (i < n && i % len == 0) head_base[i / len] = carry + items[j];
        }
        __syncthreads();  // the head bases of this pass are visible
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int i = first + j;
            if (i < n) {
                const int h = i / len;
                const int r = i - h * len;
                const int x = carry + items[j];
                per_head[h * (len + 1) + r] = x - head_base[h];
                if (r == 0 && h > 0) per_head[(h - 1) * (len + 1) + len] = x - head_base[h - 1];
                if (flat_out != nullptr) flat_out[i] = flat_carry + flat[j];
            }
        }
        carry += total;
        flat_carry += flat_total;
        __syncthreads();  // the next pass reuses the scan storage
    }
    if (threadIdx.x == 0) {
        if (len == 0) {
            for (int h = 0; h < kIndexHeads; ++h) per_head[h] = 0;
        } else {
            per_head[(kIndexHeads - 1) * (len + 1) + len] = carry - head_base[kIndexHeads - 1];
        }
        if (flat_out != nullptr) flat_out[n] = flat_carry;
    }
    __syncthreads();  // thread 0 has read head_base: the next scan may overwrite it
    return flat_carry;
}

__global__ void __launch_bounds__(kOffsetThreads) offsets_kernel(MsaVarlen v, OffsetArgs a) {
    __shared__ typename OffsetScan::TempStorage storage[2];
    __shared__ int head_base[kIndexHeads];
    const int items = scan_by_head(a.counts, v.total_rows, a.row_ptr, a.chunks, a.work_offsets, storage, head_base);
    scan_by_head(a.phys_counts, v.padded_kv_blocks, a.phys_row_ptr, nullptr, nullptr, storage, head_base);
    if (threadIdx.x != 0) return;
    *a.work_count = items;
    // The first fault is the complement of the largest word (0: none).
    const unsigned long long f = ~*a.fault;
    int* word = a.error_word;
    if (f == ~0ull) {
        word[0] = word[1] = word[2] = word[3] = 0;
    } else {
        const unsigned long long lin = f >> 8;
        const long long hq = static_cast<long long>(lin >> 4);
        const int h = int(hq / v.total_q);
        word[0] = int(f & 0xffu);
        word[1] = h;
        word[2] = int(hq - static_cast<long long>(h) * v.total_q);
        word[3] = int(lin & 15u);
    }
}

}  // namespace
}  // namespace msa
