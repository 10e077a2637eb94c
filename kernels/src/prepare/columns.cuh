// Prepare: the bitmap's column prefixes and the rows of each level (the level-major row map of
// msa_plan::layout) with their edge counts, one CTA per level; then every offset of the tables
// (k2q row_ptr, phys_row_ptr, the work-item offsets) and the error word, a CTA per (scan, head).
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

using LevelScan = cub::BlockScan<int, kLevelThreads>;
using LevelReduce = cub::BlockReduce<int, kLevelThreads>;

// Exclusive prefix of the set bits of one column, by one warp, 32 consecutive words per step
// (lane l: word 32 c + l) so every load and store is one coalesced 128-byte line. The words of
// kPrefixBatch steps are loaded before any store: the compiler cannot move a load of words
// above a store to prefix (they may alias), so one round trip per batch, not per step.
constexpr int kPrefixBatch = 8;

__device__ __forceinline__ void column_prefix(const Bitmap& bm, size_t col, int lane) {
    int carry = 0;
    for (int w0 = 0; w0 < bm.stride; w0 += 32 * kPrefixBatch) {
        int bits[kPrefixBatch];
#pragma unroll
        for (int j = 0; j < kPrefixBatch; ++j) {
            const int w = w0 + 32 * j + lane;
            bits[j] = w < bm.stride ? __popc(bm.words[col + w]) : 0;
        }
#pragma unroll
        for (int j = 0; j < kPrefixBatch; ++j) {
            int inclusive = bits[j];
#pragma unroll
            for (int d = 1; d < 32; d *= 2) {
                const int other = __shfl_up_sync(kFullMask, inclusive, d);
                if (lane >= d) inclusive += other;
            }
            const int w = w0 + 32 * j + lane;
            if (w < bm.stride) bm.prefix[col + w] = carry + inclusive - bits[j];
            carry += __shfl_sync(kFullMask, inclusive, 31);
        }
    }
}

// CTA L: the prefixes of columns (h, L), then the rows (b, L) for every fragment with
// nb_b > L: row = sum_b' min(nb_b', L) + #{b' < b : nb_b' > L} (msa_plan::layout), and per head
// the row's edges = the column's bits in the fragment's query range. A physical block's earlier
// edges come from the document's earlier fragments (fragments of a document share its blocks;
// packed order = ascending queries): from shared memory within the tile of 128 fragments,
// from the bitmap for fragments of earlier tiles.
__global__ void __launch_bounds__(kLevelThreads, kLevelCtasPerSm) level_kernel(MsaVarlen v, Bitmap bm, RowTables o) {
    __shared__ union {
        typename LevelReduce::TempStorage reduce;
        typename LevelScan::TempStorage scan[2];
    } smem;
    __shared__ int rows_before;
    __shared__ int tile_first[kLevelThreads];
    __shared__ int tile_count[kIndexHeads][kLevelThreads];
    grid_dependency_wait();  // select_kernel's bitmap
    allow_dependents();
    const int level = blockIdx.x;
    const int warp = int(threadIdx.x / 32u);
    const int lane = int(threadIdx.x % 32u);
    if (warp < kIndexHeads) column_prefix(bm, bm.column(warp, level), lane);

    int below = 0;
    for (int b = threadIdx.x; b < v.batch; b += kLevelThreads) below += min(fragment(v, b).num_blocks, level);
    const int total_below = LevelReduce(smem.reduce).Sum(below);
    if (threadIdx.x == 0) rows_before = total_below;
    __syncthreads();  // also publishes the column prefixes
    const int base_row = rows_before;
    const int R = v.total_rows;
    int active_carry = 0;
    int offset_carry = 0;
    for (int tile = 0; tile < v.batch; tile += kLevelThreads) {
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
            for (int e = f.first; e < tile; ++e) {  // a document spanning tiles (B > 128)
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
using OffsetReduce = cub::BlockReduce<int, kOffsetThreads>;
constexpr int kOffsetTile = kOffsetThreads * kOffsetItems;  // items per pass

// Shared index of item x of a pass, padded by one word per 32: the blocked reads (thread t,
// items 8t .. 8t + 7) then hit 32 distinct banks per warp.
__device__ __forceinline__ int padded(int x) { return x + (x >> 5); }

struct OffsetSmem {
    union {
        typename OffsetScan::TempStorage scan;
        typename OffsetReduce::TempStorage reduce;
    } cub;
    int buf[kOffsetTile + kOffsetTile / 32];
};

// out[r] = base + in[0] + ... + in[r - 1] for r < len, and out[len] = the same at r = len when
// write_total; returns that total. Global loads and stores are striped (consecutive threads,
// consecutive words) through shared memory, the scan is blocked (kOffsetItems per thread): one
// SM issuing the blocked pattern straight to global memory made every store instruction touch
// 32 sectors, which serialized the single-CTA version (81 us on 151:7).
__device__ int scan_segment(const int* __restrict__ in, int len, int* __restrict__ out, int base,
                            bool write_total, OffsetSmem& sm) {
    const int t = int(threadIdx.x);
    int carry = base;
    for (int tile = 0; tile < len; tile += kOffsetTile) {
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int x = j * kOffsetThreads + t;
            sm.buf[padded(x)] = tile + x < len ? in[tile + x] : 0;
        }
        __syncthreads();
        int items[kOffsetItems];
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) items[j] = sm.buf[padded(t * kOffsetItems + j)];
        int total;
        OffsetScan(sm.cub.scan).ExclusiveSum(items, items, total);
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) sm.buf[padded(t * kOffsetItems + j)] = items[j];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int x = j * kOffsetThreads + t;
            if (tile + x < len) out[tile + x] = carry + sm.buf[padded(x)];
        }
        carry += total;
        __syncthreads();  // the next pass overwrites buf and the scan storage
    }
    if (write_total && t == 0) out[len] = carry;
    return carry;
}

// 12 CTAs, each one head segment of one scan, so the three scans and four heads run side by
// side: CTA 4 j + h scans job j of head h. Job 0: counts -> row_ptr[h]; job 1: chunks -> the
// work offsets (one flat scan over 4R in head-major order: head h starts after the chunks of
// heads < h, a block reduction); job 2: physical counts -> phys_row_ptr[h]. CTA 0 also writes
// the error word, the last chunk CTA work_count and the work offsets' final entry.
__global__ void __launch_bounds__(kOffsetThreads) offsets_kernel(MsaVarlen v, OffsetArgs a) {
    __shared__ OffsetSmem sm;
    grid_dependency_wait();  // level_kernel's counts
    allow_dependents();
    const int job = int(blockIdx.x) / kIndexHeads;
    const int h = int(blockIdx.x) % kIndexHeads;
    const int R = v.total_rows;
    const int P = v.padded_kv_blocks;
    const size_t hR = static_cast<size_t>(h) * R;
    if (job == 0) {
        scan_segment(a.counts + hR, R, a.row_ptr + static_cast<size_t>(h) * (R + 1), 0, true, sm);
    } else if (job == 1) {
        int before = 0;
        for (size_t tile = 0; tile < hR; tile += kOffsetTile) {
#pragma unroll
            for (int j = 0; j < kOffsetItems; ++j) {  // independent loads, one latency per pass
                const size_t i = tile + static_cast<size_t>(j) * kOffsetThreads + threadIdx.x;
                if (i < hR) before += a.chunks[i];
            }
        }
        const int base = OffsetReduce(sm.cub.reduce).Sum(before);
        __shared__ int base_shared;
        if (threadIdx.x == 0) base_shared = base;
        __syncthreads();  // the base is visible; the scan may reuse the reduction storage
        const bool last = h == kIndexHeads - 1;
        const int items = scan_segment(a.chunks + hR, R, a.work_offsets + hR, base_shared, last, sm);
        if (last && threadIdx.x == 0) *a.work_count = items;
    } else {
        scan_segment(a.phys_counts + static_cast<size_t>(h) * P, P, a.phys_row_ptr + static_cast<size_t>(h) * (P + 1),
                     0, true, sm);
    }
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    // The first fault is the complement of the largest word (0: none).
    const unsigned long long f = ~*a.fault;
    int* word = a.error_word;
    if (f == ~0ull) {
        word[0] = word[1] = word[2] = word[3] = 0;
    } else {
        const unsigned long long lin = f >> 8;
        const long long hq = static_cast<long long>(lin >> 4);
        const int hh = int(hq / v.total_q);
        word[0] = int(f & 0xffu);
        word[1] = hh;
        word[2] = int(hq - static_cast<long long>(hh) * v.total_q);
        word[3] = int(lin & 15u);
    }
}

}  // namespace
}  // namespace msa
