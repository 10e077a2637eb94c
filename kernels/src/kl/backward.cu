// KL backward of the index branch (docs/contract.md §3.2), KV-outer like MSA's own kernel and
// deterministic without atomics.
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
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/kl.h"
#include "common/constants.cuh"
#include "common/ptx.cuh"
#include "common/scan.cuh"
#include "common/softmax.cuh"
#include "common/tile.cuh"
#include "common/varlen.cuh"

namespace msa {
namespace {

constexpr int kIndexHeads = kGroups;  // one index head per KV group; index dim = head dim
constexpr int kIndexDim = kHeadDim;
constexpr int kSlots = kTopK;  // dQI partial slots per (group, query): writer ranks 0 .. 15

constexpr int kKlThreads = 256;
constexpr int kPairs = 8;        // (query, group) pairs per tile
constexpr int kItemPairs = 512;  // pairs per work item
// The runs of one item's groups each start a new tile: at most 3 extra tiles.
constexpr int kMaxTiles = kItemPairs / kPairs + kGroups;
constexpr int kPairRows = 16;  // rows of the pair-indexed mma tiles; pairs 8 .. 15 stay zero
constexpr int kPairTileBytes = kPairRows * kTileRowBytes;
constexpr int kDkiPart = kBlock * kIndexDim;  // floats of one item's dKI partial
constexpr int kItemWords = 4;                 // (physical block, first pair, end pair, 0)
constexpr int kTableThreads = 1024;
constexpr int kReduceThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

struct KlSmem {
    alignas(128) uint8_t k[kBlock * kTileRowBytes];                     // K of the tile's group
    alignas(128) uint8_t ki[kBlock * kTileRowBytes];                    // the block's index keys
    alignas(128) uint8_t q[2][kPairs * kHeadsPerGroup * kTileRowBytes];  // [16 pair + head][d]
    alignas(128) uint8_t qi[2][kPairTileBytes];                         // [pair][d]
    alignas(128) uint8_t dz[kPairTileBytes];                            // [pair][key] bf16
    // t [pair][key]; rows padded by 4 floats so that the dz phase (8 pairs x 4 key pairs per
    // read) hits each bank at most twice instead of 8 times.
    float teacher[kPairs][kBlock + 4];
    // Per-pair scalars, double-buffered with q and qi.
    float lse2[2][kPairs][kHeadsPerGroup];  // teacher LSE * log2(e)
    float ilse2[2][kPairs];                 // indexer LSE * log2(e)
    int qrow[2][kPairs];                    // packed query; -1: no pair in this slot of the tile
    int nvis[2][kPairs];                    // keys of the block the query sees; 0 for no pair
    int slot[2][kPairs];                    // writer rank: the pair's dQI partial slot
    // The item's tiles: group, CSR position (within the group's edges) of the first pair, size.
    int tile_group[kMaxTiles];
    int tile_edge[kMaxTiles];
    int tile_count[kMaxTiles];
    int n_tiles;
};
// sm_80's opt-in limit (163 KB), so one CTA per SM on either architecture.
static_assert(sizeof(KlSmem) <= 163 * 1024, "KL smem exceeds the sm_80 limit");

struct KlParams {
    const uint16_t* q;
    const uint16_t* k;
    const float* teacher_lse;
    const uint16_t* qi;
    const uint16_t* ki;
    const float* indexer_lse;
    const int32_t* row_ptr;  // phys_row_ptr [4, P + 1]
    const int32_t* q_idx;    // phys_q_indices [4, T * 16]
    const int32_t* valid;    // phys_valid [4, T * 16]
    const int32_t* items;
    const int32_t* block_items;
    float* dqi_part;
    float* dki_part;
    uint16_t* dki;
    float grad_scale;
};

// ---------------------------------------------------------------------------------------------
// items

__global__ void __launch_bounds__(kTableThreads)
    kl_items_kernel(const int32_t* __restrict__ row_ptr, const MsaVarlen v, int32_t* __restrict__ items,
                    int32_t* __restrict__ block_items, int capacity) {
    __shared__ BlockScanSmem<kTableThreads> scan;
    const int p = v.padded_kv_blocks;
    int done = 0;
    for (int base = 0; base < p; base += kTableThreads) {
        const int pb = base + threadIdx.x;
        int pairs = 0, n = 0;
        if (pb < p) {
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                const int32_t* r = row_ptr + static_cast<int64_t>(g) * (p + 1) + pb;
                pairs += r[1] - r[0];
            }
            // Padding blocks have no key rows to write (and no pairs).
            if (block_keys(v, pb).count > 0) n = (pairs + kItemPairs - 1) / kItemPairs;
        }
        int total;
        const int at = done + block_exclusive_scan(scan, n, total);
        if (pb < p) {
            block_items[2 * pb] = at;
            block_items[2 * pb + 1] = n;
        }
        for (int i = 0; i < n; ++i) {
            int32_t* it = items + static_cast<int64_t>(at + i) * kItemWords;
            it[0] = pb;
            it[1] = i * kItemPairs;
            it[2] = min(pairs, (i + 1) * kItemPairs);
            it[3] = 0;
        }
        done += total;
    }
    for (int i = done + static_cast<int>(threadIdx.x); i < capacity; i += kTableThreads) {
        int32_t* it = items + static_cast<int64_t>(i) * kItemWords;
        it[0] = -1;
        it[1] = it[2] = it[3] = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// main

// cp.async of rows r < count of a 128-row tile from base + r * stride (the rest zero-filled).
__device__ __forceinline__ void load_block_rows(uint32_t tile, const uint16_t* base, int64_t stride, int count,
                                                const uint16_t* any) {
    tile_load_async<kBlock, kKlThreads>(
        tile, [=](int r) -> const uint16_t* { return r < count ? base + r * stride : nullptr; }, any, threadIdx.x);
}

// cp.async of one tile's q and qi rows into buffer buf (pairs past `count` zero-filled) and plain
// stores of its per-pair scalars; caller commits. q_idx and valid point at group g's edges.
__device__ __forceinline__ void load_pairs(KlSmem& s, int buf, const KlParams& a, const MsaVarlen& v, int g,
                                           const int32_t* __restrict__ q_idx, const int32_t* __restrict__ valid,
                                           int edge0, int count, int block_count) {
    const int tid = threadIdx.x;
    auto query_of = [&](int i) {
        if (i >= count) return -1;
        const int qr = q_idx[edge0 + i];
        return qr >= 0 && qr < v.total_q ? qr : -1;
    };
    // q: thread tid copies chunk tid % 16 of head tid / 16 of every pair.
    {
        const int head = tid >> 4, chunk = tid & 15;
        const uint32_t tile = smem_addr(s.q[buf]);
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
            const int qr = query_of(i);
            const int64_t row = qr >= 0 ? static_cast<int64_t>(qr) * kHeads + g * kHeadsPerGroup + head : 0;
            cp_async_16(tile + tile_offset(kHeadsPerGroup * i + head, chunk), a.q + row * kHeadDim + chunk * 8,
                        qr >= 0);
        }
    }
    // qi rows and the scalars: thread tid < 128 serves pair tid / 16 (chunk or head tid % 16).
    if (tid < kPairs * 16) {
        const int i = tid >> 4, c = tid & 15;
        const int qr = query_of(i);
        const int64_t qi_row = qr >= 0 ? static_cast<int64_t>(qr) * kIndexHeads + g : 0;
        cp_async_16(smem_addr(s.qi[buf]) + tile_offset(i, c), a.qi + qi_row * kIndexDim + c * 8, qr >= 0);
        s.lse2[buf][i][c] =
            qr >= 0 ? lse_to_log2(a.teacher_lse[static_cast<int64_t>(qr) * kHeads + g * kHeadsPerGroup + c]) : 0.f;
        if (c == 0) {
            const int w = qr >= 0 ? valid[edge0 + i] : 0;
            s.qrow[buf][i] = qr;
            s.nvis[buf][i] = qr >= 0 ? min(w & 0xff, block_count) : 0;
            s.slot[buf][i] = min((w >> 8) & 0xff, kSlots - 1);
            s.ilse2[buf][i] = qr >= 0 ? lse_to_log2(a.indexer_lse[static_cast<int64_t>(g) * v.total_q + qr]) : 0.f;
        }
    }
}

// Sum over the 8 lanes that share t = lane % 4 of v[0..7] (a reduce-scatter over lane bits 4, 3,
// 2: 7 shuffles instead of 24). Lane (g, t) receives the sum of v[g].
__device__ __forceinline__ float sum8_scatter(const float (&v)[8]) {
    const int lane = threadIdx.x & 31;
    float w4[4], w2[2];
    const bool b2 = lane & 16, b1 = lane & 8, b0 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float send = b2 ? v[i] : v[i + 4];
        w4[i] = (b2 ? v[i + 4] : v[i]) + __shfl_xor_sync(kFull, send, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float send = b1 ? w4[i] : w4[i + 2];
        w2[i] = (b1 ? w4[i + 2] : w4[i]) + __shfl_xor_sync(kFull, send, 8);
    }
    const float send = b0 ? w2[0] : w2[1];
    return (b0 ? w2[1] : w2[0]) + __shfl_xor_sync(kFull, send, 4);
}

// Largest visible-key count of the tile: keys at or past it have dz = 0 for every pair.
__device__ __forceinline__ int tile_max_visible(const KlSmem& s, int buf) {
    int m = 0;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) m = max(m, s.nvis[buf][i]);
    return m;
}

// Teacher: warp w computes pairs 2 (w % 4) and + 1 (m-tiles 0 and 1, 16 heads each) over keys
// 64 (w / 4) .. + 64 in two 32-key passes; both m-tiles share every K fragment. The column sums
// over the 16 heads go to smem as t = sum / 16 (only keys a pair sees are read later).
__device__ __forceinline__ void teacher_phase(KlSmem& s, int buf) {
    constexpr int kPass = 32, kPT = kPass / 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p0 = 2 * (warp & 3);
    const int key_lo = (warp >> 2) * (kBlock / 2);
    const int nv[2] = {s.nvis[buf][p0], s.nvis[buf][p0 + 1]};
    const int nv_max = max(nv[0], nv[1]);
    if (key_lo >= nv_max) return;  // warp-uniform
    const uint32_t q_tile = smem_addr(s.q[buf]), k_tile = smem_addr(s.k);
    uint32_t qa[2][kHeadDim / 16][4];
    float lse2[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks) ldsm_a(q_tile, kHeadsPerGroup * (p0 + mt), 16 * ks, qa[mt][ks]);
        lse2[mt][0] = s.lse2[buf][p0 + mt][g];
        lse2[mt][1] = s.lse2[buf][p0 + mt][g + 8];
    }
#pragma unroll
    for (int key0 = key_lo; key0 < key_lo + kBlock / 2; key0 += kPass) {
        if (key0 >= nv_max) break;
        float sc[2][kPT][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < kPT; ++nt) sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks)
#pragma unroll
            for (int np = 0; np < kPT / 2; ++np) {
                uint32_t b[4];
                ldsm_b_nk(k_tile, key0 + 16 * np, 16 * ks, b);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_bf16(sc[mt][2 * np], qa[mt][ks], b[0], b[1]);
                    mma_bf16(sc[mt][2 * np + 1], qa[mt][ks], b[2], b[3]);
                }
            }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            float col[2 * kPT];  // index 2 nt + c: key key0 + 8 nt + 2 t + c, rows g and g + 8 summed
#pragma unroll
            for (int nt = 0; nt < kPT; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const bool visible = key0 + 8 * nt + 2 * t + c < nv[mt];
                    const float lo = visible ? ex2(fmaf(sc[mt][nt][c], kScaleLog2e, -lse2[mt][0])) : 0.f;
                    const float hi = visible ? ex2(fmaf(sc[mt][nt][2 + c], kScaleLog2e, -lse2[mt][1])) : 0.f;
                    col[2 * nt + c] = lo + hi;
                }
            const float sum = sum8_scatter(col);
            s.teacher[p0 + mt][key0 + 8 * (g >> 1) + 2 * t + (g & 1)] = sum * (1.f / kHeadsPerGroup);
        }
    }
}

// Student and dz: warp w owns keys 16 w .. + 16 of all pairs (rows of the qi tile).
__device__ __forceinline__ void dz_phase(KlSmem& s, int buf, int max_visible) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int key_lo = 16 * warp;
    if (key_lo >= max_visible) return;  // columns no later phase reads
    const uint32_t qi_tile = smem_addr(s.qi[buf]), ki_tile = smem_addr(s.ki);
    float z[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kIndexDim / 16; ++ks) {
        uint32_t a[4], b[4];
        ldsm_a(qi_tile, 0, 16 * ks, a);
        ldsm_b_nk(ki_tile, key_lo, 16 * ks, b);
        mma_bf16(z[0], a, b[0], b[1]);
        mma_bf16(z[1], a, b[2], b[3]);
    }
    // Row g is pair g (rows g + 8 are the zero padding). Invisible keys and empty pairs get 0 by
    // selection, so no -inf or stale teacher value enters the arithmetic that is kept.
    const int nv = s.nvis[buf][g];
    const float ilse2 = s.ilse2[buf][g];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
        const int key = key_lo + 8 * nt + 2 * t;
        float d[2];
#pragma unroll
        for (int c = 0; c < 2; ++c)
            d[c] = key + c < nv ? ex2(fmaf(z[nt][c], kScaleLog2e, -ilse2)) - s.teacher[g][key + c] : 0.f;
        tile_store_pair(s.dz, g, key, pack_bf16(d[0], d[1]));  // the contract's bf16 rounding of dz
    }
}

// dQI partials: warp w computes d columns 16 w .. + 16 of dz ki for every pair and stores them at
// the pair's slot of dqi_part [4, T, 16, 128].
__device__ __forceinline__ void dqi_phase(const KlSmem& s, int buf, int group, int total_q, int max_visible,
                                          float* __restrict__ dqi_part) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int d0 = 16 * warp;
    const uint32_t dz_tile = smem_addr(s.dz), ki_tile = smem_addr(s.ki);
    float acc[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
        if (16 * kk >= max_visible) break;  // dz = 0 on the remaining keys
        uint32_t a[4], b[4];
        ldsm_a(dz_tile, 0, 16 * kk, a);
        ldsm_b_kn(ki_tile, 16 * kk, d0, b);
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
    }
    const int qr = s.qrow[buf][g];
    if (qr < 0) return;
    float* dst = dqi_part + ((static_cast<int64_t>(group) * total_q + qr) * kSlots + s.slot[buf][g]) * kIndexDim +
                 d0 + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(acc[nt][0], acc[nt][1]);
}

// dKI += dz^T qi: warp w owns keys 16 w .. + 16 (rows 16 w + g and + 8), all 128 d; the k-steps
// of this product are the tile's pairs.
__device__ __forceinline__ void dki_phase(const KlSmem& s, int buf, int max_visible, float (&dki)[kIndexDim / 8][4]) {
    const int key0 = 16 * (threadIdx.x >> 5);
    if (key0 >= max_visible) return;  // dz^T = 0 on the warp's keys
    const uint32_t dz_tile = smem_addr(s.dz), qi_tile = smem_addr(s.qi[buf]);
    uint32_t a[4];
    ldsm_a_trans(dz_tile, key0, 0, a);
#pragma unroll
    for (int np = 0; np < kIndexDim / 16; ++np) {
        uint32_t b[4];
        ldsm_b_kn(qi_tile, 0, 16 * np, b);
        mma_bf16(dki[2 * np], a, b[0], b[1]);
        mma_bf16(dki[2 * np + 1], a, b[2], b[3]);
    }
}

__global__ void __launch_bounds__(kKlThreads, 1) kl_main_kernel(const KlParams a, const MsaVarlen v) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    KlSmem& s = *reinterpret_cast<KlSmem*>(smem_raw);
    const int32_t* item = a.items + static_cast<int64_t>(blockIdx.x) * kItemWords;
    const int pb = item[0];
    if (pb < 0) return;  // past the last item (CTA-uniform)
    const int pair_begin = item[1], pair_end = item[2];
    const BlockKeys bk = block_keys(v, pb);
    const int tid = threadIdx.x;
    const int p = v.padded_kv_blocks;
    const int64_t group_edges = static_cast<int64_t>(v.total_q) * kTopK;

    if (tid == 0) {
        int n = 0, offset = 0;
        for (int g = 0; g < kGroups; ++g) {
            const int32_t* r = a.row_ptr + static_cast<int64_t>(g) * (p + 1) + pb;
            const int lo = r[0], count = r[1] - r[0];
            const int x0 = max(pair_begin, offset), x1 = min(pair_end, offset + count);
            for (int x = x0; x < x1; x += kPairs) {
                s.tile_group[n] = g;
                s.tile_edge[n] = lo + x - offset;
                s.tile_count[n] = min(kPairs, x1 - x);
                ++n;
            }
            offset += count;
        }
        s.n_tiles = n;
    }
    // Rows 8 .. 15 of the pair tiles are mma padding that no load writes: finite zeros, so the
    // padded products contribute exactly 0.
    for (int i = tid; i < 3 * (kPairTileBytes / 2 / 16); i += kKlThreads) {
        const int region = i / (kPairTileBytes / 2 / 16), at = i % (kPairTileBytes / 2 / 16);
        uint8_t* tile = region == 0 ? s.qi[0] : region == 1 ? s.qi[1] : s.dz;
        reinterpret_cast<uint4*>(tile + kPairTileBytes / 2)[at] = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncthreads();
    const int n_tiles = s.n_tiles;

    auto load_k = [&](int g) {
        load_block_rows(smem_addr(s.k), a.k + (static_cast<int64_t>(bk.start) * kGroups + g) * kHeadDim,
                        static_cast<int64_t>(kGroups) * kHeadDim, bk.count, a.k);
    };
    auto load_tile = [&](int j, int buf) {
        const int g = s.tile_group[j];
        load_pairs(s, buf, a, v, g, a.q_idx + g * group_edges, a.valid + g * group_edges, s.tile_edge[j],
                   s.tile_count[j], bk.count);
    };

    float dki[kIndexDim / 8][4];
#pragma unroll
    for (int nt = 0; nt < kIndexDim / 8; ++nt) dki[nt][0] = dki[nt][1] = dki[nt][2] = dki[nt][3] = 0.f;

    if (n_tiles > 0) {
        load_k(s.tile_group[0]);
        load_block_rows(smem_addr(s.ki), a.ki + static_cast<int64_t>(bk.start) * kIndexDim, kIndexDim, bk.count, a.ki);
        load_tile(0, 0);
        cp_async_commit();
    }
    for (int j = 0; j < n_tiles; ++j) {
        const int buf = j & 1;
        cp_async_wait<0>();
        __syncthreads();  // (A) K of the tile's group, q, qi and the scalars of tile j have landed
        // Buffer buf ^ 1 was last read by tile j - 1, which ended at its barrier (D).
        if (j + 1 < n_tiles) {
            load_tile(j + 1, buf ^ 1);
            cp_async_commit();
        }
        teacher_phase(s, buf);
        __syncthreads();  // (B) teacher done; K is free
        if (j + 1 < n_tiles && s.tile_group[j + 1] != s.tile_group[j]) {
            load_k(s.tile_group[j + 1]);  // lands while dz, dQI and dKI of tile j run
            cp_async_commit();
        }
        const int max_visible = tile_max_visible(s, buf);
        dz_phase(s, buf, max_visible);
        __syncthreads();  // (C) dz complete
        dqi_phase(s, buf, s.tile_group[j], v.total_q, max_visible, a.dqi_part);
        dki_phase(s, buf, max_visible, dki);
        __syncthreads();  // (D) teacher, dz, qi[buf] and the scalars of buf are free
    }

    // Warp w holds keys 16 w + g and 16 w + g + 8 (lane (g, t): d columns 8 nt + 2 t, + 1).
    const int warp = tid >> 5, lane = tid & 31;
    const bool only_item = a.block_items[2 * pb + 1] == 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = 16 * warp + (lane >> 2) + 8 * r;
        if (only_item) {
            if (key >= bk.count) continue;
            uint16_t* dst = a.dki + (static_cast<int64_t>(bk.start) + key) * kIndexDim + 2 * (lane & 3);
#pragma unroll
            for (int nt = 0; nt < kIndexDim / 8; ++nt)
                *reinterpret_cast<uint32_t*>(dst + 8 * nt) =
                    pack_bf16(dki[nt][2 * r] * a.grad_scale, dki[nt][2 * r + 1] * a.grad_scale);
        } else {
            float* dst = a.dki_part + static_cast<int64_t>(blockIdx.x) * kDkiPart + key * kIndexDim + 2 * (lane & 3);
#pragma unroll
            for (int nt = 0; nt < kIndexDim / 8; ++nt)
                *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(dki[nt][2 * r], dki[nt][2 * r + 1]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// reductions

// One warp per (group, query): lane l sums d columns 4 l .. 4 l + 3 over the query's slots.
__global__ void __launch_bounds__(kReduceThreads)
    kl_dqi_kernel(const float* __restrict__ dqi_part, const int32_t* __restrict__ topk, const MsaVarlen v,
                  float grad_scale, uint16_t* __restrict__ dqi) {
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (kReduceThreads / 32) + (threadIdx.x >> 5);
    if (row >= static_cast<int64_t>(kIndexHeads) * v.total_q) return;  // warp-uniform
    const int t = static_cast<int>(row % v.total_q), g = static_cast<int>(row / v.total_q);
    const int b = v.query_fragment[t];
    const int num_blocks = (v.cu_seqlens_k[b + 1] - v.cu_seqlens_k[v.fragment_first[b]] + kBlock - 1) / kBlock;
    // The physical CSR has one edge per entry 0 <= e < num_blocks, and the writer ranks of a
    // query's edges are 0 .. count - 1: exactly the slots the main kernel wrote.
    const int e = lane < kTopK ? topk[row * kTopK + lane] : -1;
    const int count = __popc(__ballot_sync(kFull, e >= 0 && e < num_blocks));
    const float4* src = reinterpret_cast<const float4*>(dqi_part + row * kSlots * kIndexDim) + lane;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int slot = 0; slot < count; ++slot) {
        const float4 x = src[slot * (kIndexDim / 4)];
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
    }
    const uint2 out = make_uint2(pack_bf16(acc.x * grad_scale, acc.y * grad_scale),
                                 pack_bf16(acc.z * grad_scale, acc.w * grad_scale));
    *reinterpret_cast<uint2*>(dqi + (static_cast<int64_t>(t) * kIndexHeads + g) * kIndexDim + 4 * lane) = out;
}

// One CTA per physical block with zero or several items (single-item blocks were written by the
// main kernel): thread i sums 4 d columns of one key over the items in order.
__global__ void __launch_bounds__(kReduceThreads)
    kl_dki_kernel(const float* __restrict__ dki_part, const int32_t* __restrict__ block_items, const MsaVarlen v,
                  float grad_scale, uint16_t* __restrict__ dki) {
    const int pb = blockIdx.x;
    const BlockKeys bk = block_keys(v, pb);
    const int first = block_items[2 * pb], n = block_items[2 * pb + 1];
    if (bk.count == 0 || n == 1) return;
    for (int i = threadIdx.x; i < bk.count * (kIndexDim / 4); i += kReduceThreads) {
        const int key = i / (kIndexDim / 4), c = i % (kIndexDim / 4);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int it = 0; it < n; ++it) {
            const float4 x =
                reinterpret_cast<const float4*>(dki_part + static_cast<int64_t>(first + it) * kDkiPart + key * kIndexDim)[c];
            acc.x += x.x;
            acc.y += x.y;
            acc.z += x.z;
            acc.w += x.w;
        }
        const uint2 out = make_uint2(pack_bf16(acc.x * grad_scale, acc.y * grad_scale),
                                     pack_bf16(acc.z * grad_scale, acc.w * grad_scale));
        *reinterpret_cast<uint2*>(dki + (static_cast<int64_t>(bk.start) + key) * kIndexDim + 4 * c) = out;
    }
}

// ---------------------------------------------------------------------------------------------
// workspace

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

}  // namespace
}  // namespace msa

extern "C" int msa_kl_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    msa::KlWorkspace w;
    if (!msa::kl_workspace(varlen, w)) return cudaErrorInvalidValue;
    *bytes = w.bytes;
    return cudaSuccess;
}

extern "C" int msa_kl_backward(const uint16_t* q, const uint16_t* k, const float* teacher_lse, const uint16_t* qi,
                               const uint16_t* ki, const float* indexer_lse, const int32_t* topk,
                               const int32_t* phys_row_ptr, const int32_t* phys_q_indices, const int32_t* phys_valid,
                               MsaVarlen varlen, float loss_coeff, uint16_t* dqi, uint16_t* dki, void* workspace,
                               size_t workspace_bytes, void* stream) {
    msa::KlWorkspace w;
    if (!msa::kl_workspace(varlen, w) || workspace_bytes < w.bytes) return cudaErrorInvalidValue;
    if (w.capacity > 0x7fffffff) return cudaErrorInvalidValue;
    if (varlen.total_q == 0 && varlen.total_k == 0) return cudaSuccess;
    uint8_t* ws = static_cast<uint8_t*>(workspace);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int capacity = static_cast<int>(w.capacity);
    // grad_scale = iscale * loss_coeff / (4 T) in double, rounded once (as the reference).
    const double t = varlen.total_q > 0 ? varlen.total_q : 1;
    const float grad_scale = static_cast<float>(0.088388347648318440550 * static_cast<double>(loss_coeff) / (4.0 * t));

    msa::KlParams a;
    a.q = q;
    a.k = k;
    a.teacher_lse = teacher_lse;
    a.qi = qi;
    a.ki = ki;
    a.indexer_lse = indexer_lse;
    a.row_ptr = phys_row_ptr;
    a.q_idx = phys_q_indices;
    a.valid = phys_valid;
    a.items = reinterpret_cast<const int32_t*>(ws + w.items);
    a.block_items = reinterpret_cast<const int32_t*>(ws + w.block_items);
    a.dqi_part = reinterpret_cast<float*>(ws + w.dqi_part);
    a.dki_part = reinterpret_cast<float*>(ws + w.dki_part);
    a.dki = dki;
    a.grad_scale = grad_scale;

    msa::kl_items_kernel<<<1, msa::kTableThreads, 0, s>>>(phys_row_ptr, varlen, reinterpret_cast<int32_t*>(ws + w.items),
                                                          reinterpret_cast<int32_t*>(ws + w.block_items), capacity);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;

    if (capacity > 0) {
        const int smem = static_cast<int>(sizeof(msa::KlSmem));
        err = cudaFuncSetAttribute(msa::kl_main_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
        msa::kl_main_kernel<<<capacity, msa::kKlThreads, smem, s>>>(a, varlen);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }

    if (varlen.total_q > 0) {
        const int64_t rows = static_cast<int64_t>(msa::kIndexHeads) * varlen.total_q;
        const int64_t ctas = (rows + msa::kReduceThreads / 32 - 1) / (msa::kReduceThreads / 32);
        msa::kl_dqi_kernel<<<static_cast<unsigned>(ctas), msa::kReduceThreads, 0, s>>>(a.dqi_part, topk, varlen,
                                                                                       grad_scale, dqi);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }

    if (varlen.padded_kv_blocks > 0) {
        msa::kl_dki_kernel<<<varlen.padded_kv_blocks, msa::kReduceThreads, 0, s>>>(a.dki_part, a.block_items, varlen,
                                                                                     grad_scale, dki);
        err = cudaGetLastError();
    }
    return err;
}
