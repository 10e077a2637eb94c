// Mainloop tile math of the KV-outer backward kernels on the sm_80 path (mma.sync, cp.async;
// atomic main kernel and deterministic dK/dV, whose loops over task rows or CSR entries call it
// per half tile): one 128-key block of one group is resident in smem while tiles of queries that
// selected it stream through. NeMo's task tile is 8 query slots x 16 heads = 128 rows; here it
// is processed as two 64-row half tiles (4 slots), which keeps K, V, one half of Q and dO, and
// P, dS in 128 KB of smem (sm_80 fits 163 KB) and the dK/dV accumulators in registers. Per half
// tile:
//
//   phase 1 (kv_outer_scores): S = Q K^T, dP = dO V^T; warp w: slot w % 4 (its 16 heads = the 16
//            mma rows), keys 64 (w / 4) .. +64 in two 32-key passes; P = 2^(S scale log2e - lse
//            log2e) masked to the slot's visible keys, dS = P (dP - delta) scale; both go to smem
//            in bf16 (the MMA operand precision, as in MSA and NeMo);
//   phase 2 (kv_outer_dkv): warp w owns keys 16 w .. +16: dV += P^T dO, dK += dS^T Q, fp32
//            registers that live across the whole segment (scale already inside dS);
//   phase 3 (kv_outer_dq, main kernel only): dQ = dS K; warp w: slot w % 4, d 64 (w / 4) .. +64,
//            reduced into the fp32 dQ accumulator with atomics.
//
// Visibility: slot i of a half tile sees keys r < n_visible[i] of the block (0 = invalid slot:
// padding, or a query that cannot see the block). Phase 1 writes every P/dS entry (exact zeros
// where masked); phases 2 and 3 additionally skip 16-key steps that are entirely masked, which
// only saves work.
#pragma once

#include <cstdint>

#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/softmax.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "common/sm80/mma.cuh"
#include "common/sm80/tile.cuh"

namespace msa {

constexpr int kKvOuterThreads = 256;
constexpr int kSlotsPerTask = kTaskQueries;  // query slots of a task row
constexpr int kSlotsPerHalf = 4;
constexpr int kHalfRows = kSlotsPerHalf * kHeadsPerGroup;  // 64 rows: row 16 i + h = slot i, head h
constexpr int kHalfTileBytes = kHalfRows * kTileRowBytes;  // 16 KB
constexpr int kAccTiles = kHeadDim / 8;                    // d n-tiles of a dK/dV accumulator row block

struct KvOuterSmem {
    alignas(128) uint8_t k[kBlock * kTileRowBytes];  // [128 keys][128 d]
    alignas(128) uint8_t v[kBlock * kTileRowBytes];
    alignas(128) uint8_t q[kHalfTileBytes];          // [64 rows][128 d]
    alignas(128) uint8_t dout[kHalfTileBytes];
    alignas(128) uint8_t p[kHalfTileBytes];          // [64 rows][128 keys]
    alignas(128) uint8_t ds[kHalfTileBytes];
    // Row scalars, double-buffered: the next half tile's are written while phase 3 reads these.
    float lse2[2][kHalfRows];  // lse * log2(e) (0 for invalid slots: their P is forced to 0)
    float delta[2][kHalfRows];
    int qrow[2][kSlotsPerHalf];
    int n_visible[2][kSlotsPerHalf];
};

struct SlotInfo {
    int qrow;       // packed query, meaningful iff n_visible > 0
    int n_visible;  // visible keys of the resident block; 0 = slot contributes nothing
};

__device__ __forceinline__ SlotInfo invalid_slot() { return SlotInfo{-1, 0}; }

// cp.async of the block's K and V rows of group g (rows past bk.count zero-filled); caller commits.
__device__ __forceinline__ void kv_outer_load_block(KvOuterSmem& s, const uint16_t* __restrict__ k,
                                                    const uint16_t* __restrict__ v, int g, BlockKeys bk) {
    auto rows_of = [&](const uint16_t* base) {
        return [=](int r) -> const uint16_t* {
            return r < bk.count ? base + (static_cast<int64_t>(bk.start + r) * kGroups + g) * kHeadDim : nullptr;
        };
    };
    tile_load_async<kBlock, kKvOuterThreads>(smem_addr(s.k), rows_of(k), k, threadIdx.x);
    tile_load_async<kBlock, kKvOuterThreads>(smem_addr(s.v), rows_of(v), v, threadIdx.x);
}

// cp.async of one half tile's Q and dO rows (invalid slots zero-filled, so S and dP stay finite)
// and plain stores of its row scalars into buffer buf; caller commits. slot_info(i), i < 4, is
// evaluated by every thread. Thread tid copies chunk tid % 16 of head tid / 16 for all 4 slots.
template <class SlotFn>
__device__ __forceinline__ void kv_outer_load_half(KvOuterSmem& s, int buf, const uint16_t* __restrict__ q,
                                                   const uint16_t* __restrict__ dout, const float* __restrict__ lse,
                                                   const float* __restrict__ delta, int g, SlotFn&& slot_info) {
    static_assert(kKvOuterThreads == kHeadsPerGroup * 16, "one thread per (head, 16-byte chunk)");
    const int tid = threadIdx.x, head = tid >> 4, chunk = tid & 15;
    const uint32_t q_tile = smem_addr(s.q), do_tile = smem_addr(s.dout);
#pragma unroll
    for (int i = 0; i < kSlotsPerHalf; ++i) {
        const SlotInfo si = slot_info(i);
        const bool valid = si.n_visible > 0;
        const int64_t row = valid ? static_cast<int64_t>(si.qrow) * kHeads + g * kHeadsPerGroup + head : 0;
        const uint32_t dst = tile_offset(kHeadsPerGroup * i + head, chunk);
        cp_async_16(q_tile + dst, q + row * kHeadDim + chunk * 8, valid);
        cp_async_16(do_tile + dst, dout + row * kHeadDim + chunk * 8, valid);
        if (chunk == 0) {
            s.lse2[buf][kHeadsPerGroup * i + head] = valid ? lse_to_log2(lse[row]) : 0.f;
            s.delta[buf][kHeadsPerGroup * i + head] = valid ? delta[row] : 0.f;
        }
        if (tid == 0) {
            s.qrow[buf][i] = si.qrow;
            s.n_visible[buf][i] = si.n_visible;
        }
    }
}

// Phase 1: P and dS of the half tile into smem.
__device__ __forceinline__ void kv_outer_scores(KvOuterSmem& s, int buf) {
    constexpr int kChunk = 32, kCT = kChunk / 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int slot = warp % kSlotsPerHalf;
    const int m0 = kHeadsPerGroup * slot;
    const int row0 = m0 + (lane >> 2);  // accumulator rows row0 (e < 2) and row0 + 8
    const int n_visible = s.n_visible[buf][slot];
    const float lse2[2] = {s.lse2[buf][row0], s.lse2[buf][row0 + 8]};
    const float delta[2] = {s.delta[buf][row0], s.delta[buf][row0 + 8]};
    const uint32_t q_tile = smem_addr(s.q), do_tile = smem_addr(s.dout);
    const uint32_t k_tile = smem_addr(s.k), v_tile = smem_addr(s.v);
#pragma unroll 1
    for (int key0 = (warp / kSlotsPerHalf) * (kBlock / 2); key0 < (warp / kSlotsPerHalf + 1) * (kBlock / 2);
         key0 += kChunk) {
        float sc[kCT][4], dp[kCT][4];
#pragma unroll
        for (int nt = 0; nt < kCT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[nt][e] = dp[nt][e] = 0.f;
        if (key0 < n_visible) {  // warp-uniform; a fully masked chunk only writes zeros
#pragma unroll
            for (int ks = 0; ks < kHeadDim / 16; ++ks) {
                uint32_t qa[4], da[4];
                ldsm_a(q_tile, m0, 16 * ks, qa);
                ldsm_a(do_tile, m0, 16 * ks, da);
#pragma unroll
                for (int np = 0; np < kCT / 2; ++np) {
                    uint32_t b[4];
                    ldsm_b_nk(k_tile, key0 + 16 * np, 16 * ks, b);
                    mma_bf16(sc[2 * np], qa, b[0], b[1]);
                    mma_bf16(sc[2 * np + 1], qa, b[2], b[3]);
                    ldsm_b_nk(v_tile, key0 + 16 * np, 16 * ks, b);
                    mma_bf16(dp[2 * np], da, b[0], b[1]);
                    mma_bf16(dp[2 * np + 1], da, b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < kCT; ++nt) {
            float p[4], ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1;
                const bool visible = key0 + 8 * nt + 2 * t + (e & 1) < n_visible;
                p[e] = visible ? ex2(fmaf(sc[nt][e], kScaleLog2e, -lse2[r])) : 0.f;
                ds[e] = p[e] * (dp[nt][e] - delta[r]) * kScale;
            }
            const int col = key0 + 8 * nt + 2 * t;
            tile_store_pair(s.p, row0, col, pack_bf16(p[0], p[1]));
            tile_store_pair(s.p, row0 + 8, col, pack_bf16(p[2], p[3]));
            tile_store_pair(s.ds, row0, col, pack_bf16(ds[0], ds[1]));
            tile_store_pair(s.ds, row0 + 8, col, pack_bf16(ds[2], ds[3]));
        }
    }
}

// Phase 2: dV += P^T dO and dK += dS^T Q for the warp's 16 keys (rows of dk, dv: key 16 w + g and
// 16 w + g + 8; columns: d). The k-steps of this product are the 4 slots.
__device__ __forceinline__ void kv_outer_dkv(KvOuterSmem& s, int buf, float (&dk)[kAccTiles][4],
                                             float (&dv)[kAccTiles][4]) {
    const int warp = threadIdx.x >> 5;
    const int key0 = 16 * warp;
    const uint32_t q_tile = smem_addr(s.q), do_tile = smem_addr(s.dout);
    const uint32_t p_tile = smem_addr(s.p), ds_tile = smem_addr(s.ds);
#pragma unroll
    for (int slot = 0; slot < kSlotsPerHalf; ++slot) {
        if (key0 >= s.n_visible[buf][slot]) continue;  // P = dS = 0 on all of the warp's keys
        uint32_t pa[4], dsa[4];
        ldsm_a_trans(p_tile, key0, kHeadsPerGroup * slot, pa);
        ldsm_a_trans(ds_tile, key0, kHeadsPerGroup * slot, dsa);
#pragma unroll
        for (int np = 0; np < kAccTiles / 2; ++np) {
            uint32_t b[4];
            ldsm_b_kn(do_tile, kHeadsPerGroup * slot, 16 * np, b);
            mma_bf16(dv[2 * np], pa, b[0], b[1]);
            mma_bf16(dv[2 * np + 1], pa, b[2], b[3]);
            ldsm_b_kn(q_tile, kHeadsPerGroup * slot, 16 * np, b);
            mma_bf16(dk[2 * np], dsa, b[0], b[1]);
            mma_bf16(dk[2 * np + 1], dsa, b[2], b[3]);
        }
    }
}

// Phase 3: dQ = dS K for slot w % 4, d columns 64 (w / 4) .. +64, reduced into
// dq_accum [T, 64, 128] fp32 with unordered atomics.
__device__ __forceinline__ void kv_outer_dq(KvOuterSmem& s, int buf, float* __restrict__ dq_accum, int g) {
    constexpr int kDT = kHeadDim / 2 / 8;  // 8 n-tiles of the warp's 64 columns
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slot = warp % kSlotsPerHalf;
    const int d0 = (warp / kSlotsPerHalf) * (kHeadDim / 2);
    const int n_visible = s.n_visible[buf][slot];
    if (n_visible == 0) return;
    const uint32_t ds_tile = smem_addr(s.ds), k_tile = smem_addr(s.k);
    float acc[kDT][4];
#pragma unroll
    for (int nt = 0; nt < kDT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
        if (16 * kk >= n_visible) break;  // dS = 0 on the remaining keys
        uint32_t a[4];
        ldsm_a(ds_tile, kHeadsPerGroup * slot, 16 * kk, a);
#pragma unroll
        for (int np = 0; np < kDT / 2; ++np) {
            uint32_t b[4];
            ldsm_b_kn(k_tile, 16 * kk, d0 + 16 * np, b);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
    const int64_t head_row = static_cast<int64_t>(s.qrow[buf][slot]) * kHeads + g * kHeadsPerGroup + (lane >> 2);
    float* lo = dq_accum + head_row * kHeadDim + d0 + 2 * (lane & 3);
    float* hi = lo + 8 * kHeadDim;
#pragma unroll
    for (int nt = 0; nt < kDT; ++nt) {
        red_add_f32x2(lo + 8 * nt, acc[nt][0], acc[nt][1]);
        red_add_f32x2(hi + 8 * nt, acc[nt][2], acc[nt][3]);
    }
}

__device__ __forceinline__ void zero_acc(float (&acc)[kAccTiles][4]) {
#pragma unroll
    for (int nt = 0; nt < kAccTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
}

}  // namespace msa
