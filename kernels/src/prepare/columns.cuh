// Prepare's level and offsets phases: the bitmap's column prefixes and the rows of each level
// (the level-major row map of msa_plan::layout) with their edge counts, one 128-thread group per
// level; then every offset of the tables (k2q row_ptr, phys_row_ptr, the work-item offsets) and
// the error word, a CTA per (scan, head).
#pragma once

#include "common/scan.cuh"
#include "prepare/edges.cuh"
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

// Half a CTA (warps 4 id .. 4 id + 3) with its own named barrier (1 + id; 0 is __syncthreads),
// so the two halves of a CTA each run a level of their own and may run different numbers of
// levels. Sums over the group are of ints, so any order gives what a block-wide scan gave.
constexpr int kLevelWarps = kLevelThreads / 32;
static_assert(kThreads == 2 * kLevelThreads, "two level groups per CTA");
static_assert(kLevelWarps == kIndexHeads, "a warp per head's column");

struct LevelGroup {
    int id;    // 0 or 1
    int t;     // thread within the group
    int warp;  // warp within the group: the head whose column it scans
    int lane;

    // Immediate barrier ids: a register id makes ptxas reserve all 16 barriers.
    __device__ __forceinline__ void sync() const {
        if (id == 0) {
            asm volatile("bar.sync 1, %0;" ::"n"(kLevelThreads) : "memory");
        } else {
            asm volatile("bar.sync 2, %0;" ::"n"(kLevelThreads) : "memory");
        }
    }
};

struct LevelSmem {
    int reduce[kLevelWarps];
    int scan[2][kLevelWarps];
    int tile_first[kLevelThreads];
    int tile_count[kIndexHeads][kLevelThreads];
};

// The sum of x over the group. sm.reduce is rewritten by the next call only after the group's
// next barrier (the caller's tile loop has two per level).
__device__ __forceinline__ int group_sum(int x, LevelSmem& sm, const LevelGroup& g) {
#pragma unroll
    for (int d = 16; d > 0; d /= 2) x += __shfl_xor_sync(kFullMask, x, d);
    if (g.lane == 0) sm.reduce[g.warp] = x;
    g.sync();
    int total = 0;
#pragma unroll
    for (int w = 0; w < kLevelWarps; ++w) total += sm.reduce[w];
    return total;
}

// Exclusive sums over the group (in thread order) of two values and their totals; sm.scan is
// rewritten only after the caller's next barrier, as above.
__device__ __forceinline__ void group_scan2(int a, int b, int& a_before, int& a_total, int& b_before, int& b_total,
                                            LevelSmem& sm, const LevelGroup& g) {
    int ia = a, ib = b;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const int ya = __shfl_up_sync(kFullMask, ia, d);
        const int yb = __shfl_up_sync(kFullMask, ib, d);
        if (g.lane >= d) {
            ia += ya;
            ib += yb;
        }
    }
    if (g.lane == 31) {
        sm.scan[0][g.warp] = ia;
        sm.scan[1][g.warp] = ib;
    }
    g.sync();
    a_before = ia - a;
    b_before = ib - b;
    a_total = 0;
    b_total = 0;
#pragma unroll
    for (int w = 0; w < kLevelWarps; ++w) {
        const int wa = sm.scan[0][w], wb = sm.scan[1][w];
        if (w < g.warp) {
            a_before += wa;
            b_before += wb;
        }
        a_total += wa;
        b_total += wb;
    }
}

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

// Level L on group g: the prefixes of columns (h, L), then the rows (b, L) for every fragment
// with nb_b > L: row = sum_b' min(nb_b', L) + #{b' < b : nb_b' > L} (msa_plan::layout), and per
// head the row's edges = the column's bits in the fragment's query range. A physical block's
// earlier edges come from the document's earlier fragments (fragments of a document share its
// blocks; packed order = ascending queries): from shared memory within the tile of 128
// fragments, from the bitmap for fragments of earlier tiles.
__device__ __forceinline__ void level_group(const MsaVarlen& v, const Bitmap& bm, const RowTables& o, int level,
                                            LevelSmem& sm, const LevelGroup& g) {
    column_prefix(bm, bm.column(g.warp, level), g.lane);  // a warp per head

    int below = 0;
    for (int b = g.t; b < v.batch; b += kLevelThreads) below += min(fragment(v, b).num_blocks, level);
    const int base_row = group_sum(below, sm, g);  // its barrier also publishes the column prefixes
    const int R = v.total_rows;
    int active_carry = 0;
    int offset_carry = 0;
    for (int tile = 0; tile < v.batch; tile += kLevelThreads) {
        const int b = tile + g.t;
        Frag f{};
        if (b < v.batch) f = fragment(v, b);
        const int active = f.num_blocks > level ? 1 : 0;
        int active_before, active_total, offset, offset_total;
        group_scan2(active, f.num_blocks, active_before, active_total, offset, offset_total, sm, g);
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
        sm.tile_first[g.t] = b < v.batch ? f.first : -1;
#pragma unroll
        for (int h = 0; h < kIndexHeads; ++h) sm.tile_count[h][g.t] = count[h];
        g.sync();  // the tile's counts are visible
        if (active) {
            const int row = base_row + active_carry + active_before;
            o.row_map[offset + level] = row;
            o.row_frag[row] = b;
            o.row_level[row] = level;
            int earlier[kIndexHeads] = {};
            for (int e = max(f.first, tile); e < b; ++e) {
                if (sm.tile_first[e - tile] != f.first) continue;
#pragma unroll
                for (int h = 0; h < kIndexHeads; ++h) earlier[h] += sm.tile_count[h][e - tile];
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
        g.sync();  // the next tile (or level) reuses the scan storage and the tile arrays
    }
    if (level == 0 && g.t == 0) o.row_offsets[v.batch] = offset_carry;
}

struct OffsetArgs {
    const unsigned long long* fault;  // from the select phase
    const int* counts;
    const int* chunks;
    const int* phys_counts;
    int* work_offsets;  // [4R + 1]: exclusive scan of chunks
    int* row_ptr;       // [4, R + 1]
    int* phys_row_ptr;  // [4, P + 1]
    int* work_count;    // [1]
    int* error_word;    // [4]
};

constexpr int kOffsetTile = kThreads * kOffsetItems;  // items per pass

// Shared index of item x of a pass, padded by one word per 32: the blocked reads (thread t,
// items 16t .. 16t + 15; word 16t + j + t/2) then hit 32 distinct banks per warp.
__device__ __forceinline__ int padded(int x) { return x + (x >> 5); }

struct OffsetSmem {
    BlockScanSmem<kThreads> scan;
    int buf[kOffsetTile + kOffsetTile / 32];
};

// out[r] = base + in[0] + ... + in[r - 1] for r < len, and out[len] = the same at r = len when
// write_total; returns that total. Global loads and stores are striped (consecutive threads,
// consecutive words) through shared memory, the scan is blocked (kOffsetItems per thread, summed,
// scanned across the CTA, then written back as running prefixes): one SM issuing the blocked
// pattern straight to global memory made every store instruction touch 32 sectors, which
// serialized the single-CTA version (81 us on 151:7). `in` was written earlier in this kernel,
// so it is read by plain (coherent) loads, never __restrict__ (ld.global.nc).
__device__ int scan_segment(const int* in, int len, int* out, int base, bool write_total, OffsetSmem& sm) {
    const int t = int(threadIdx.x);
    int carry = base;
    for (int tile = 0; tile < len; tile += kOffsetTile) {
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int x = j * kThreads + t;
            sm.buf[padded(x)] = tile + x < len ? in[tile + x] : 0;
        }
        __syncthreads();
        int sum = 0;
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) sum += sm.buf[padded(t * kOffsetItems + j)];
        int total;
        int run = block_exclusive_scan<kThreads>(sm.scan, sum, total);
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int x = padded(t * kOffsetItems + j);
            const int item = sm.buf[x];
            sm.buf[x] = run;
            run += item;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kOffsetItems; ++j) {
            const int x = j * kThreads + t;
            if (tile + x < len) out[tile + x] = carry + sm.buf[padded(x)];
        }
        carry += total;
        __syncthreads();  // the next pass overwrites buf
    }
    if (write_total && t == 0) out[len] = carry;
    return carry;
}

// Virtual CTA `job_cta` of 12, each one head segment of one scan, so the three scans and four
// heads run side by side: 4 j + h scans job j of head h. Job 0: counts -> row_ptr[h]; job 1:
// chunks -> the work offsets (one flat scan over 4R in head-major order: head h starts after the
// chunks of heads < h, a block reduction); job 2: physical counts -> phys_row_ptr[h]. CTA 0 also
// writes the error word, the last chunk CTA work_count and the work offsets' final entry. Ends
// on a barrier (or touches no shared memory), so a CTA may run the next job at once.
__device__ __forceinline__ void offsets_job(const MsaVarlen& v, const OffsetArgs& a, int job_cta,
                                            OffsetSmem& sm) {
    const int job = job_cta / kIndexHeads;
    const int h = job_cta % kIndexHeads;
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
                const size_t i = tile + static_cast<size_t>(j) * kThreads + threadIdx.x;
                if (i < hR) before += a.chunks[i];
            }
        }
        int base;
        block_exclusive_scan<kThreads>(sm.scan, before, base);
        const bool last = h == kIndexHeads - 1;
        const int items = scan_segment(a.chunks + hR, R, a.work_offsets + hR, base, last, sm);
        if (last && threadIdx.x == 0) *a.work_count = items;
    } else {
        scan_segment(a.phys_counts + static_cast<size_t>(h) * P, P, a.phys_row_ptr + static_cast<size_t>(h) * (P + 1),
                     0, true, sm);
    }
    if (job_cta == 0 && threadIdx.x == 0) write_error_word(v, *a.fault, a.error_word);
}

}  // namespace
}  // namespace msa
