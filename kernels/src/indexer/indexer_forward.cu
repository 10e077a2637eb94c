// Lightning indexer forward (docs/contract.md §3.1), three deterministic launches (the scores kernel
// uses mma.sync, the sm_80 path that also runs on sm_90a; tiles and select are arch-neutral):
//
//   tiles  one CTA lays out the query tiles: 64 consecutive queries of one fragment, so that they
//          share k_base and one index-key block in smem serves all of them and their 4 heads;
//   scores CTA (tile, chunk of 32 key blocks) keeps its 256 rows (query, head) of qi in mma A
//          registers and streams the chunk's ki blocks through a two-stage cp.async pipeline;
//          per (row, block) it writes the max of s = qi.ki * iscale over the visible keys and
//          sum exp(s - max) to the workspace [4, T, max_blocks] (two f32 arrays). Splitting the
//          key range over grid.y keeps the grid balanced when one document holds most queries;
//   select one warp per (head, query): exact top-k by (score desc, id asc) over the block maxima,
//          the local block appended, and the LSE merged from the selected blocks' (max, sum).
//
// Every output element has one writer and a fixed arithmetic order: no atomics anywhere.
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/indexer.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/scan.cuh"
#include "common/softmax.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "common/sm80/mma.cuh"
#include "common/sm80/tile.cuh"

namespace msa {
namespace {

// The 4 index heads (common/constants.cuh) share the one index-key head; index dim and scale
// equal the attention's.
constexpr int kIndexRow = kIndexHeads * kIndexDim;  // elements of one query's qi rows

constexpr int kTileQueries = 64;
constexpr int kScoreThreads = 256;
constexpr int kWarpQueries = kTileQueries / (kScoreThreads / 32);  // 8 queries x 4 heads = 32 rows
constexpr int kChunkBlocks = 32;                                     // key blocks per scores CTA
constexpr int kPassKeys = 64;  // keys per mma pass: 2 m-tiles x 8 n-tiles of accumulators
constexpr int kPassTiles = kPassKeys / 8;
constexpr int kTableThreads = 1024;
constexpr int kSelectThreads = 256;

static_assert(kWarpQueries * kIndexHeads == 32, "a warp owns two 16-row m-tiles");

// ---------------------------------------------------------------------------------------------
// tiles

__global__ void __launch_bounds__(kTableThreads)
    indexer_tiles_kernel(const MsaVarlen v, int32_t* __restrict__ tile_q0, int capacity) {
    __shared__ BlockScanSmem<kTableThreads> scan;
    int done = 0;
    for (int base = 0; base < v.batch; base += kTableThreads) {
        const int b = base + threadIdx.x;
        int q_start = 0, n = 0;
        if (b < v.batch) {
            q_start = v.cu_seqlens_q[b];
            n = (v.cu_seqlens_q[b + 1] - q_start + kTileQueries - 1) / kTileQueries;
        }
        int total;
        const int at = done + block_exclusive_scan(scan, n, total);
        for (int i = 0; i < n; ++i) tile_q0[at + i] = q_start + i * kTileQueries;
        done += total;
    }
    for (int i = done + static_cast<int>(threadIdx.x); i < capacity; i += kTableThreads) tile_q0[i] = -1;
}

// ---------------------------------------------------------------------------------------------
// scores

struct ScoresSmem {
    alignas(128) uint8_t ki[2][kBlock * kTileRowBytes];  // two stages of [128 keys][128 d]: 64 KB
};
static_assert(sizeof(ScoresSmem) <= 163 * 1024, "indexer smem exceeds the sm_80 limit");

// A fragments (16 rows x 128 d) of one m-tile straight from global memory, rows g and g + 8 from
// lo and hi (nullptr: a row past the tile, loaded as zeros). Once per CTA, so no smem staging.
__device__ __forceinline__ void load_rows_guarded(const uint16_t* lo, const uint16_t* hi, uint32_t (&a)[8][4]) {
    const int c = 2 * (threadIdx.x & 3);
    const uint32_t* l = lo ? reinterpret_cast<const uint32_t*>(lo + c) : nullptr;
    const uint32_t* h = hi ? reinterpret_cast<const uint32_t*>(hi + c) : nullptr;
#pragma unroll
    for (int ks = 0; ks < kIndexDim / 16; ++ks) {
        a[ks][0] = l ? __ldg(l + 8 * ks) : 0u;
        a[ks][1] = h ? __ldg(h + 8 * ks) : 0u;
        a[ks][2] = l ? __ldg(l + 8 * ks + 4) : 0u;
        a[ks][3] = h ? __ldg(h + 8 * ks + 4) : 0u;
    }
}

// Tile rows are (local query lq, head h) = 4 lq + h, i.e. consecutive rows of qi viewed as
// [T * 4, 128]. Warp w owns rows 32 w .. 32 w + 31 (queries 8 w .. 8 w + 7) as m-tiles 0 and 1;
// lane (g, t) holds rows g and g + 8 of each, i.e. queries 8 w + 4 mt + g / 4 (+ 2), head g % 4.
__global__ void __launch_bounds__(kScoreThreads, 1)
    indexer_scores_kernel(const uint16_t* __restrict__ qi, const uint16_t* __restrict__ ki,
                          const int32_t* __restrict__ tile_q0, const MsaVarlen v, float* __restrict__ bmax,
                          float* __restrict__ bsum) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    ScoresSmem& s = *reinterpret_cast<ScoresSmem*>(smem_raw);
    const int q0 = tile_q0[blockIdx.x];
    if (q0 < 0) return;  // past the last tile (CTA-uniform)
    const FragmentCoord f = fragment_coord(v, v.query_fragment[q0]);
    const int k_base = f.k_base;
    const int q_start = f.q_start, q_end = f.q_start + f.q_len;
    const int k_len = f.k_len;
    const int nq = min(kTileQueries, q_end - q0);
    const int pos0 = k_len - (q_end - q_start) + (q0 - q_start);  // position of the tile's first query
    const int p_last = pos0 + nq - 1;
    const int e_begin = blockIdx.y * kChunkBlocks;
    const int e_end = min(p_last / kBlock + 1, e_begin + kChunkBlocks);
    if (e_begin >= e_end) return;  // the chunk lies past every query of the tile (CTA-uniform)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    // Keys past the tile's last query are never visible: leave them zero-filled (and unread).
    auto load = [&](int e, int stage) {
        const int n_keys = min(kBlock, p_last + 1 - e * kBlock);
        const uint16_t* base = ki + (static_cast<int64_t>(k_base) + e * kBlock) * kIndexDim;
        tile_load_async<kBlock, kScoreThreads>(
            smem_addr(s.ki[stage]),
            [=](int r) -> const uint16_t* { return r < n_keys ? base + static_cast<int64_t>(r) * kIndexDim : nullptr; },
            ki, tid);
    };
    load(e_begin, 0);
    cp_async_commit();

    // The warp's rows, loaded while the first block streams in. pos < 0 marks a row past the tile.
    uint32_t a[2][kIndexDim / 16][4];
    int pos[2][2];
    const int head = g & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        const uint16_t* rows[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int lq = kWarpQueries * warp + 4 * mt + 2 * r + (g >> 2);
            const bool valid = lq < nq;
            pos[mt][r] = valid ? pos0 + lq : -1;
            rows[r] = valid ? qi + static_cast<int64_t>(q0 + lq) * kIndexRow + head * kIndexDim : nullptr;
        }
        load_rows_guarded(rows[0], rows[1], a[mt]);
    }
    const int wq0 = kWarpQueries * warp;  // the warp's first local query
    const bool warp_active = wq0 < nq;
    const int p_min = pos0 + wq0, p_max = pos0 + min(wq0 + kWarpQueries, nq) - 1;

    for (int e = e_begin; e < e_end; ++e) {
        const int u = e - e_begin;
        // Block e + 1 streams in while block e is computed; the group count stays uniform (an
        // empty group at the end) so wait_group<1> always means "block e has landed".
        if (e + 1 < e_end) load(e + 1, (u + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int key_base = e * kBlock;
        if (warp_active && key_base <= p_max) {  // warp-uniform: some row of the warp sees block e
            const uint32_t tile = smem_addr(s.ki[u & 1]);
            int nv[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) nv[mt][r] = pos[mt][r] < 0 ? 0 : max(0, min(kBlock, pos[mt][r] - key_base + 1));
            // Masks are needed only where some row of the warp stops inside the block.
            const bool partial = key_base + kBlock - 1 > p_min;
            OnlineSoftmax sm[2];
            sm[0].init();
            sm[1].init();
#pragma unroll
            for (int key0 = 0; key0 < kBlock; key0 += kPassKeys) {
                if (key_base + key0 > p_max) break;  // no row of the warp sees these keys
                float sc[2][kPassTiles][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < kPassTiles; ++nt) sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.f;
#pragma unroll
                for (int ks = 0; ks < kIndexDim / 16; ++ks)
#pragma unroll
                    for (int np = 0; np < kPassTiles / 2; ++np) {
                        uint32_t bf[4];
                        ldsm_b_nk(tile, key0 + 16 * np, 16 * ks, bf);
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            mma_bf16(sc[mt][2 * np], a[mt][ks], bf[0], bf[1]);
                            mma_bf16(sc[mt][2 * np + 1], a[mt][ks], bf[2], bf[3]);
                        }
                    }
                // Rows past the tile hold qi = 0, so their scores stay finite; they are never written.
                float no_output[1][4] = {};  // block statistics only: no accumulator to rescale
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    if (partial) mask_keys_rows(sc[mt], key0, nv[mt][0], nv[mt][1]);
                    sm[mt].update(sc[mt], no_output);
                }
            }
            // sm.m is the block max of x = s * iscale * log2(e) and sum_j 2^(x_j - m) is the block
            // sum relative to it: B = m ln 2 is the block max of s * iscale in natural units.
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float l = quad_sum(sm[mt].l[r]);
                    if ((lane & 3) == 0 && nv[mt][r] > 0) {
                        const int q = q0 + pos[mt][r] - pos0;
                        const int64_t at = (static_cast<int64_t>(head) * v.total_q + q) * v.max_blocks + e;
                        bmax[at] = sm[mt].m[r] * kLn2;
                        bsum[at] = l;
                    }
                }
        }
        // Stage u & 1 is refilled by the next iteration's load.
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// select

// The ranking key of block e: larger = better. High word: the score's bits mapped to an unsigned
// total order (-0 and +0 are one score, so ties between them fall to the id); low word: ~e, so
// the smaller id wins a tie. Every key is > 0, so 0 means "no candidate".
__device__ __forceinline__ uint64_t rank_key(float score, int e) {
    const uint32_t u = __float_as_uint(score == 0.f ? 0.f : score);
    const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (static_cast<uint64_t>(ordered) << 32) | (0xffffffffu - static_cast<uint32_t>(e));
}

// The best key below `below` among this lane's candidates e = lane, lane + 32, ... < n.
__device__ __forceinline__ uint64_t lane_best(const float* __restrict__ scores, int n, uint64_t below) {
    uint64_t best = 0;
#pragma unroll 4
    for (int e = threadIdx.x & 31; e < n; e += 32) {
        const uint64_t key = rank_key(scores[e], e);
        if (key < below && key > best) best = key;
    }
    return best;
}

__global__ void __launch_bounds__(kSelectThreads)
    indexer_select_kernel(const float* __restrict__ bmax, const float* __restrict__ bsum, const MsaVarlen v,
                          int32_t* __restrict__ topk, float* __restrict__ lse) {
    constexpr unsigned kFull = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (kSelectThreads / 32) + (threadIdx.x >> 5);
    if (row >= static_cast<int64_t>(kIndexHeads) * v.total_q) return;  // warp-uniform; no barriers below
    const int t = static_cast<int>(row % v.total_q);
    const int local = query_coord(v, t).pos / kBlock;
    const int k = min(kTopK - 1, local);
    const float* scores = bmax + row * v.max_blocks;

    // k rounds of a warp argmax. Keys are unique, so the winner's lane is the only one whose best
    // is now taken: it alone rescans, below the winner; the others' bests are still the best
    // below it. Candidates are the non-local blocks 0 .. local - 1.
    uint64_t best = lane_best(scores, local, ~0ull);
    int chosen = -1;
    for (int round = 0; round < k; ++round) {
        uint64_t w = best;
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) {
            const uint64_t o = __shfl_xor_sync(kFull, w, d);
            w = o > w ? o : w;
        }
        if (lane == round) chosen = static_cast<int>(0xffffffffu - static_cast<uint32_t>(w));
        if (best == w) best = lane_best(scores, local, w);
    }
    const int id = lane < k ? chosen : (lane == k ? local : -1);
    if (lane < kTopK) topk[row * kTopK + lane] = id;

    // LSE = logsumexp_b (B_b + ln sum_b) over the k + 1 selected blocks, merged in a fixed order.
    float bm = -INFINITY, bs = 0.f;
    if (id >= 0) {
        bm = scores[id];
        bs = bsum[row * v.max_blocks + id];
    }
    float m = bm;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, d));
    float sum = id >= 0 ? bs * expf(bm - m) : 0.f;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(kFull, sum, d);
    if (lane == 0) lse[row] = m + logf(sum);
}

// ---------------------------------------------------------------------------------------------
// workspace

struct IndexerWorkspace {
    size_t bmax, bsum, tiles, bytes;  // byte offsets of the parts and the total
    int64_t tile_capacity;
};

constexpr size_t kAlign = 256;

__host__ __forceinline__ size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

__host__ bool indexer_workspace(const MsaVarlen& v, IndexerWorkspace& w) {
    if (v.total_q < 0 || v.batch < 0 || v.max_blocks < 0) return false;
    const size_t scores = static_cast<size_t>(kIndexHeads) * v.total_q * v.max_blocks * sizeof(float);
    w.tile_capacity = (static_cast<int64_t>(v.total_q) + static_cast<int64_t>(kTileQueries - 1) * v.batch) / kTileQueries;
    w.bmax = 0;
    w.bsum = align_up(scores);
    w.tiles = w.bsum + align_up(scores);
    w.bytes = w.tiles + align_up(static_cast<size_t>(w.tile_capacity) * sizeof(int32_t));
    return true;
}

// The three launches; the scores kernel is the sm_80 path (mma.sync, also run on sm_90a).
cudaError_t indexer_forward_sm80(const MsaIndexerParams& p, const IndexerWorkspace& w, uint8_t* ws,
                                 cudaStream_t s) {
    const MsaVarlen& varlen = p.varlen;
    float* bmax = reinterpret_cast<float*>(ws + w.bmax);
    float* bsum = reinterpret_cast<float*>(ws + w.bsum);
    int32_t* tiles = reinterpret_cast<int32_t*>(ws + w.tiles);
    const int capacity = static_cast<int>(w.tile_capacity);

    MSA_TRY(launch(indexer_tiles_kernel, 1, kTableThreads, s, varlen, tiles, capacity));

    const dim3 grid(capacity, (varlen.max_blocks + kChunkBlocks - 1) / kChunkBlocks);
    MSA_TRY(launch_smem(indexer_scores_kernel, grid, kScoreThreads, sizeof(ScoresSmem), s, p.qi, p.ki, tiles, varlen,
                        bmax, bsum));

    const int64_t rows = static_cast<int64_t>(kIndexHeads) * varlen.total_q;
    const int64_t ctas = (rows + kSelectThreads / 32 - 1) / (kSelectThreads / 32);
    return launch(indexer_select_kernel, static_cast<unsigned>(ctas), kSelectThreads, s, bmax, bsum, varlen, p.topk,
                  p.lse);
}

}  // namespace
}  // namespace msa

extern "C" int msa_indexer_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    msa::IndexerWorkspace w;
    if (!msa::indexer_workspace(varlen, w)) return cudaErrorInvalidValue;
    *bytes = w.bytes;
    return cudaSuccess;
}

extern "C" int msa_indexer_forward(const MsaIndexerParams* params, void* workspace, size_t workspace_bytes,
                                   void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    msa::IndexerWorkspace w;
    if (!msa::indexer_workspace(params->varlen, w) || workspace_bytes < w.bytes) return cudaErrorInvalidValue;
    if (params->varlen.total_q == 0) return cudaSuccess;
    if (w.tile_capacity > 0x7fffffff) return cudaErrorInvalidValue;
    uint8_t* ws = static_cast<uint8_t*>(workspace);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return msa::dispatch_arch([&] { return msa::indexer_forward_sm80(*params, w, ws, s); });
}
