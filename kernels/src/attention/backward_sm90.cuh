// Sparse attention backward main kernel for Hopper (sm_90a): KV-outer, FlashAttention-3's
// head-dim-128 configuration (docs/perf/attention-backward-sm90.md). A work item is (KV group g,
// physical block pb, a range of pb's row of prepare's physical CSR): the block's K and V stay in
// shared memory while tiles of 4 selecting queries x the group's 16 heads (64 rows) stream
// through. Per tile, each of two consumer warpgroups owns 64 of the block's 128 keys:
//   S^T = K Q^T, dP^T = V dO^T        SS wgmma m64n64 (keys x rows), swapped so P^T and dS^T
//                                      come out in the layout of an A operand;
//   P^T = 2^(S^T scale log2e - lse log2e) on the visible (key, query) pairs, 0 elsewhere;
//   dS^T = scale P^T (dP^T - delta)   (the softmax scale rides on dS, rounded to bf16, as v1);
//   dV += P^T dO, dK += dS^T Q         RS wgmma m64n128: fp32 registers for the whole item;
//   dQ = dS K                          SS wgmma m64n64 from dS^T in shared memory (each consumer
//                                      one 64-column half of d), staged in shared memory and
//                                      added into the fp32 dQ accumulator with one bulk
//                                      reduce-add of 8 KiB per query.
// At the item's end a block whose whole CSR row is this item writes dK, dV in bf16; a block whose
// row is split over several items adds them into its fp32 slot of `dkv_acc` (kDet: stores them in
// a part of its own), and backward_epilogue_kernel casts those (kDet: sums a row's parts in order). The blocks nobody selected get their zeros from the
// producer warpgroup's two otherwise idle warps while the consumers compute (on a long document
// that is most of dK, dV: 388 MB on a 189K-key rank, 0.12 ms as a pass of its own).
// A producer warp loads K and V per item and Q, dO (tensor boxes of one query's 16 heads; a
// missing query loads zeros) and the lse / delta rows per tile into a 2-stage ring. The CTAs
// claim items as they free up: the first by CTA index, the next from a counter once the current
// item's last tile is issued; the producer hands each to the consumers through shared memory
// with its K/V (kv_full), and a sentinel item ends them. So the list can follow the L2 (items by
// query band: attention/backward_items.cuh) while the grid balances itself.
// Deterministic mode (kDet, the same kernel): each dQ contribution is rounded to its row's grid
// (attention/backward_det_grid.cuh), so the reduce-adds are exact and their order cannot matter;
// each item of a split row stores its dK/dV in a part of its own, and the epilogue adds a row's
// parts in id order: nothing waits on another CTA (an ordered chain of adds into one slot per row
// cost 1.09x on recent16 and 1.13x on spread, run 56).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/varlen.cuh"
#include "common/sm90/arch.cuh"
#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/wgmma.cuh"
#include "attention/backward_det_grid.cuh"
#include "attention/backward_items.cuh"
#include "attention/dq_fragments.cuh"

namespace msa::bwd90 {

// Round-to-nearest-even bf16 pair (lo in the low half), any architecture.
__device__ __forceinline__ uint32_t pack_bf16_host(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;  // two consumer warpgroups; each arrives on an "empty" barrier
constexpr int kStages = 2;
constexpr int kTileQueries = 4;
constexpr int kRows = kTileQueries * kHeadsPerGroup;  // 64
constexpr int kKvHalf = kBlock * 128;                 // [128 keys][64 d] bf16
constexpr int kKvBytes = 2 * kKvHalf;
constexpr int kQHalf = kRows * 128;                   // [64 rows][64 d] bf16
constexpr int kQBytes = 2 * kQHalf;
constexpr int kTokenBytes = kHeadsPerGroup * 128;     // one query's 16 rows of a half
static_assert(kTileQueries == kItemTileQueries, "the order's tiles are the kernel's");

// The dQ accumulator is zeroed inside the main kernel, by the producer warpgroup's warp 1, while
// the consumers work (the list is group-major): units of kDqZeroTokens queries of one group,
// claimed in group order; group g's first reduce-add waits until all its units are done.
constexpr int kDqZeroTokens = 32;
// Groups after the first are zeroed over the first kDqZeroPaceNum / kDqZeroPaceDen of the items
// handed out before them (zero_dq_groups; 3/4 and 1/2 measured alike, run 146).
constexpr int kDqZeroPaceNum = 3;
constexpr int kDqZeroPaceDen = 4;

// setmaxnreg per warpgroup: multiples of 8 that balance the launch's 168 registers a thread
// (65,536 / 384, rounded down to 8): 128 x (168 - producer) = 256 x (consumer - 168).
// The consumers take 240 (+0.7% over 232, run 49); the producer-side code spills 27
// instructions at 24, off the tensor pipe's path.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
static_assert(128 * (168 - kProducerRegs) == 256 * (kConsumerRegs - 168), "balanced split");

// The queries of one tile: packed index (-1 = empty slot) and keys of the block it sees.
struct TileInfo {
    int t[kTileQueries];
    int nv[kTileQueries];
};

// The dQ staging is double-buffered (209 KB): no "staging free" barrier.
template <bool kDet>
struct Smem {
    static constexpr int kDqBuffers = 2;
    uint8_t k[kKvBytes];
    uint8_t v[kKvBytes];
    uint8_t q[kStages][kQBytes];
    uint8_t dout[kStages][kQBytes];
    uint8_t ds[kBlock * kRows * 2];  // dS^T [128 keys][64 rows] bf16, 128-byte swizzle
    float dq[kDqBuffers][kRows * kHeadDim];  // dQ of the tile, 4 chunks in fragment order
    alignas(128) float zeros[kDqChunk];  // the source of the dQ zeroing's bulk stores
    float lse[kStages][kRows];
    float delta[kStages][kRows];
    TileInfo info[kStages];
    int4 item;  // the item of the K/V in k, v (x < 0: none left), published by kv_full
    uint64_t kv_full, kv_empty;
    uint64_t q_full[kStages], q_empty[kStages];
    alignas(16) float step[kDet ? kStages : 1][kDet ? kRows : 1];  // kDet: each row's dQ grid (bulk loads)
};
template <bool kDet>
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem<kDet>));
static_assert(kSmemBytes<true> <= kMaxSmemSm90 && kSmemBytes<false> <= kMaxSmemSm90, "the shared memory fits a block");

struct Params {
    const int4* items;      // (group, physical block, first CSR entry, end CSR entry), claim order
    const int32_t* counts;  // [kCountWords]: items, dK/dV slots (backward_items_kernel), then:
    int32_t* claim;         // counts + 2: items claimed past the first gridDim.x (zeroed by the build)
    int32_t* zero_claim;    // counts + 3: dQ-zeroing units claimed
    int32_t* zero_done;     // counts + 4: [4] dQ-zeroing units done per group
    const int32_t* group_first;  // counts + kGroupFirstWord: [4] each group's first claim index
    const int32_t* phys_q_indices;  // [4, T * 16]
    const int32_t* phys_valid;      // [4, T * 16]: visible keys in the low 8 bits
    const float* lse;               // [T, 64]
    const float* delta;             // [T, 64]
    const int32_t* split_slot;  // [4, P]: slot in dkv_acc of a row split over items, else -1
    const int32_t* phys_row_ptr;  // [4, P + 1]: an empty row (nobody selected the block) gets zeros
    MsaVarlen varlen;
    float* dq_accum;  // [T, 4, 2048]: attention/dq_fragments.cuh
    float* dkv_acc;   // [slots, 2, 128 keys, 128 d]: dK, dV of split rows (zeroed); kDet: [parts, ...]
    uint16_t* dk;     // [Tk, 4, 128]
    uint16_t* dv;
    // kDet only (attention/backward_det_grid.cuh, attention/backward_items.cuh):
    const float* dq_step;       // [T, 64]: the grid of each dQ row's contributions
    const int32_t* split_part;  // [4, P]: a split row's first part in dkv_acc, else -1
};

#if MSA_SM90A_ENABLED
using namespace msa::sm90;

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Accumulator (m64 x n64, rows = keys, columns = query rows) → A fragments over the columns.
__device__ __forceinline__ void to_a_frags(const float (&x)[32], uint32_t (&a)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        a[kk][0] = pack_bf16(x[8 * kk], x[8 * kk + 1]);
        a[kk][1] = pack_bf16(x[8 * kk + 2], x[8 * kk + 3]);
        a[kk][2] = pack_bf16(x[8 * kk + 4], x[8 * kk + 5]);
        a[kk][3] = pack_bf16(x[8 * kk + 6], x[8 * kk + 7]);
    }
}

// This thread's dQ fragments (warp w: query slot w; attention/dq_fragments.cuh) into staging
// buffer buf, made visible to the bulk copies.
template <bool kDet>
__device__ __forceinline__ void stage_dq(Smem<kDet>& sm, const float (&dq)[32], int buf, int warp, int lane, int wg) {
    float4* dst = reinterpret_cast<float4*>(&sm.dq[buf][warp * kDqChunk + wg * kDqHalf]) + lane;
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[32 * i] = make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]);
    fence_proxy_async_smem();
}

// dQ-zeroing units per group (kDqZeroTokens queries each).
__device__ __forceinline__ int dq_zero_units(const MsaVarlen& vl) { return (vl.total_q + kDqZeroTokens - 1) / kDqZeroTokens; }

// The issuer's reductions of staged buffer buf into the fp32 dQ accumulator, one per query; the
// first of group g waits for the group's zeros (bit g of `zeroed`: seen complete).
template <bool kDet>
__device__ __forceinline__ void reduce_dq(const Params& p, Smem<kDet>& sm, const int (&t)[kTileQueries], int g,
                                          int buf, uint32_t& zeroed) {
    if (!(zeroed >> g & 1u)) {
        const int units = dq_zero_units(p.varlen);
        while (ld_acquire_gpu(p.zero_done + g) < units) __nanosleep(256);
        fence_proxy_async_global();  // the zeros (generic stores) before the reduce-adds (async proxy)
        zeroed |= 1u << g;
    }
#pragma unroll
    for (int slot = 0; slot < kTileQueries; ++slot) {
        if (t[slot] >= 0)
            bulk_reduce_add_f32(p.dq_accum + (static_cast<int64_t>(t[slot]) * kGroups + g) * kDqChunk,
                                &sm.dq[buf][slot * kDqChunk], kDqChunk * 4);
    }
    bulk_commit();
}

// Named barrier 1: both consumer warpgroups (dS complete; dQ staged).
__device__ __forceinline__ void consumers_sync() { named_sync(1, 256); }

template <bool kDet>
__device__ __forceinline__ void consumer(Smem<kDet>& sm, const Params& p, int wg) {
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int c = 2 * (lane & 3);
    const int key0 = 64 * wg + 16 * warp + (lane >> 2);  // rows key0 and key0 + 8 of the block
    const bool issuer = threadIdx.x == 128;  // issues the dQ reductions
    const int head = lane >> 2;               // dQ rows head and head + 8 of query slot `warp`
    int tile_it = 0;
    // Tile j's dQ is staged and reduced during tile j + 1, while that tile's S^T is in flight
    // (the tensor pipe idled through the staging); the last tile's after the loop.
    // The pending dQ is a copy: ptxas cannot tell across the loop's back edge that the dQ
    // product's registers are complete, and waited for every wgmma in flight before reading them.
    float dq_pend[32] = {};
    int pend_t[kTileQueries], pend_g = -1;  // pend_g < 0: nothing pending
    float pend_step0 = 0.f, pend_step1 = 0.f;  // kDet: the pending rows' grids
    uint32_t zeroed = 0;                        // the issuer's: groups whose dQ zeros it has seen
    auto stage_pending = [&]() {
        const int buf = (tile_it - 1) & 1;
        if constexpr (kDet) {
            // Rounded here, while the next tile's S^T is in flight, not on the tile's tail.
#pragma unroll
            for (int i = 0; i < 32; ++i) dq_pend[i] = to_grid(dq_pend[i], (i & 2) ? pend_step1 : pend_step0);
        }
        stage_dq(sm, dq_pend, buf, warp, lane, wg);
        if (issuer) bulk_wait_read_all();  // tile_it - 2's reductions have read the other buffer
        consumers_sync();
        if (issuer) reduce_dq(p, sm, pend_t, pend_g, buf, zeroed);
    };
    for (int item_it = 0;; ++item_it) {
        mbar_wait(&sm.kv_full, item_it & 1);
        const int4 item = sm.item;  // read before kv_empty lets the producer write the next
        if (item.x < 0) break;
        const int g = item.x, pb = item.y;
        const int tiles = (item.w - item.z + kTileQueries - 1) / kTileQueries;
        float dk[64], dv[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.f;

        for (int j = 0; j < tiles; ++j, ++tile_it) {
            const int st = tile_it % kStages;
            mbar_wait(&sm.q_full[st], (tile_it / kStages) & 1);
            const uint32_t q_addr = smem_u32(sm.q[st]), do_addr = smem_u32(sm.dout[st]);
            const uint32_t k_addr = smem_u32(sm.k), v_addr = smem_u32(sm.v);

            // S^T and dP^T go out together; dV and dK after P and dS (computing P while dP^T is
            // in flight and dS while dV is measured 15% slower: docs/perf/attention-backward-sm90.md).
            float s[32], dp[32];
            // Defined inputs for S^T's first wgmma (it ignores them): left undefined, they may
            // share registers with the pending dQ, and ptxas then waits for every wgmma.
#pragma unroll
            for (int i = 0; i < 32; ++i) s[i] = 0.f;
            const uint64_t kd = sw128_desc_uniform(k_addr + wg * 8192, 16, 1024);
            const uint64_t vd = sw128_desc_uniform(v_addr + wg * 8192, 16, 1024);
            const uint64_t qd = sw128_desc_uniform(q_addr, 16, 1024), dod = sw128_desc_uniform(do_addr, 16, 1024);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                const uint32_t half = (ks >> 2), off = (ks & 3) * 32;
                wgmma_m64n64k16_ss<0, 0>(s, desc_advance(kd, half * kKvHalf + off), desc_advance(qd, half * kQHalf + off),
                                         ks > 0);
            }
            wgmma_commit();
            if (pend_g >= 0) {
                stage_pending();
                wgmma_fence();
            }
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                const uint32_t half = (ks >> 2), off = (ks & 3) * 32;
                wgmma_m64n64k16_ss<0, 0>(dp, desc_advance(vd, half * kKvHalf + off),
                                         desc_advance(dod, half * kQHalf + off), ks > 0);
            }
            wgmma_commit();
            const TileInfo info = sm.info[st];
            // P^T is computed while dP^T is still in flight (+1.2%, run 47).
            wgmma_wait<1>();
            fence_regs(s);

            // P^T in place; column 8i + c + e is head (8i + c + e) % 16 of query slot i / 2.
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int nv = info.nv[i >> 1];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float lse2 = sm.lse[st][8 * i + c + e] * kLog2e;
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int idx = 4 * i + 2 * r + e;
                        s[idx] = key0 + 8 * r < nv ? ex2(fmaf(s[idx], kScaleLog2e, -lse2)) : 0.f;
                    }
                }
            }
            uint32_t pf[4][4], dsf[4][4];
            to_a_frags(s, pf);
            wgmma_wait<0>();
            fence_regs(dp);

            // dS^T = scale P^T (dP^T - delta); zero where P is masked (select, never multiply: the
            // masked scores may be anything).
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int nv = info.nv[i >> 1];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float dl = sm.delta[st][8 * i + c + e];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int idx = 4 * i + 2 * r + e;
                        dp[idx] = key0 + 8 * r < nv ? s[idx] * (dp[idx] - dl) * kScale : 0.f;
                    }
                }
            }
            to_a_frags(dp, dsf);
            // dS^T into shared memory for dQ: element (key, col) at key * 128 + col * 2, 16-byte
            // chunks XORed with key % 8 (the 128-byte swizzle the dQ wgmma reads).
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int key = key0 + 8 * r;
                    const uint32_t off = key * 128 + ((i ^ (key & 7)) << 4) + c * 2;
                    *reinterpret_cast<uint32_t*>(sm.ds + off) = dsf[i >> 1][2 * (i & 1) + r];
                }
            fence_proxy_async_smem();
            const uint64_t do_mn = sw128_desc_uniform(do_addr, kQHalf, 1024), q_mn = sw128_desc_uniform(q_addr, kQHalf, 1024);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_rs<1>(dv, pf[kk], desc_advance(do_mn, kk * 2048), 1);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_rs<1>(dk, dsf[kk], desc_advance(q_mn, kk * 2048), 1);
            wgmma_commit();

            consumers_sync();  // both halves of dS^T are in shared memory
            float dq[32];
            const uint64_t dsd = sw128_desc_uniform(smem_u32(sm.ds), 16, 1024);
            const uint64_t k_mn = sw128_desc_uniform(k_addr + wg * kKvHalf, 16, 1024);
#pragma unroll
            for (int ks = 0; ks < 8; ++ks)
                wgmma_m64n64k16_ss<1, 1>(dq, desc_advance(dsd, ks * 2048), desc_advance(k_mn, ks * 2048), ks > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(dv);
            fence_regs(dk);
            fence_regs(dq);
            if constexpr (kDet) {  // the previous tile's were used by its staging, above
                pend_step0 = sm.step[st][16 * warp + head];
                pend_step1 = sm.step[st][16 * warp + head + 8];
            }
            mbar_release(&sm.q_empty[st]);

            // Stage dQ (4 chunks in fragment order, attention/dq_fragments.cuh: warp w holds query
            // slot w) into buffer tile_it % 2 and reduce it per query: the issuer thread, during
            // the next tile (stage_pending). Buffer b's last reductions (tile_it - 2) finished
            // reading it before the issuer passed tile_it - 1's "staged" barrier, and that barrier
            // (after each warpgroup's dQ wait) also orders this tile's dS^T writes after both
            // warpgroups' previous dQ products. kDet: each value rounded to its row's grid there.
            // (Per-warpgroup staging and reductions with dS^T double-buffered, so that the
            // warpgroups meet once per tile, measured 6% slower: docs/perf.)
#pragma unroll
            for (int i = 0; i < 32; ++i) dq_pend[i] = dq[i];
            fence_regs(dq_pend);
#pragma unroll
            for (int slot = 0; slot < kTileQueries; ++slot) pend_t[slot] = info.t[slot];
            pend_g = g;
        }
        mbar_release(&sm.kv_empty);

        // dK, dV of this thread's two keys (rows past the block's keys skipped).
        const BlockKeys bk = block_keys(p.varlen, pb);
        const int slot = p.split_slot[g * p.varlen.padded_kv_blocks + pb];
        int64_t acc_row = slot;  // kDet: this item's part of its split row (ids consecutive from the first)
        if constexpr (kDet) {
            if (slot >= 0)
                acc_row = p.split_part[g * p.varlen.padded_kv_blocks + pb] +
                          (item.z - p.phys_row_ptr[g * (p.varlen.padded_kv_blocks + 1) + pb]) / kKvItemQueries;
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = key0 + 8 * r;
            if (key >= bk.count) continue;
            if (slot < 0) {
                const int64_t base = (static_cast<int64_t>(bk.start) + key) * kKRowElems + g * kHeadDim + c;
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    *reinterpret_cast<uint32_t*>(p.dk + base + 8 * i) = pack_bf16(dk[4 * i + 2 * r], dk[4 * i + 2 * r + 1]);
                    *reinterpret_cast<uint32_t*>(p.dv + base + 8 * i) = pack_bf16(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
                }
            } else {
                float* acc = p.dkv_acc + (acc_row * 2 * kBlock + key) * kHeadDim + c;
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    const float2 kx = make_float2(dk[4 * i + 2 * r], dk[4 * i + 2 * r + 1]);
                    const float2 vx = make_float2(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
                    if constexpr (kDet) {
                        __stcg(reinterpret_cast<float2*>(acc + 8 * i), kx);
                        __stcg(reinterpret_cast<float2*>(acc + kBlock * kHeadDim + 8 * i), vx);
                    } else {
                        atomicAdd(reinterpret_cast<float2*>(acc + 8 * i), kx);
                        atomicAdd(reinterpret_cast<float2*>(acc + kBlock * kHeadDim + 8 * i), vx);
                    }
                }
            }
        }
    }
    if (pend_g >= 0) stage_pending();  // the last tile's (tile_it - 1)
    if (issuer) bulk_wait_all();
}

// Lane `lane` < 4 of the tile at CSR entry e of an item of group g ending at `end`: its query t
// (-1: none, or it sees no key of the block) and the keys of the block it sees, nv.
__device__ __forceinline__ void tile_entry(const Params& p, int g, int e, int end, int keys, int lane, int& t,
                                           int& nv) {
    const int64_t at = g * static_cast<int64_t>(p.varlen.total_q) * kTopK + e + lane;
    t = -1;
    nv = 0;
    if (lane < kTileQueries && e + lane < end) {
        t = p.phys_q_indices[at];
        nv = min(p.phys_valid[at] & 0xff, keys);
        if (t < 0 || t >= p.varlen.total_q || nv <= 0) t = -1, nv = 0;
    }
}

// The producer warpgroup's spare warps (2 and 3), warp w of nw: zeros into dK, dV of every
// (group, block) row with no CSR entry, rows strided over the grid's nw x gridDim.x warps; a warp
// stores two key rows (2 x 256 bytes of one group's 128 columns) per instruction.
__device__ __forceinline__ void zero_unselected(const Params& p, int w, int nw) {
    const int lane = threadIdx.x & 31, P = p.varlen.padded_kv_blocks;
    const uint4 z = make_uint4(0, 0, 0, 0);
    for (int r = nw * blockIdx.x + w; r < kGroups * P; r += nw * gridDim.x) {
        const int g = r / P, pb = r - g * P;
        const int32_t* row_ptr = p.phys_row_ptr + static_cast<int64_t>(g) * (P + 1);
        if (row_ptr[pb + 1] != row_ptr[pb]) continue;
        const BlockKeys bk = block_keys(p.varlen, pb);
        for (int key = lane >> 4; key < bk.count; key += 2) {
            const int64_t at = (static_cast<int64_t>(bk.start) + key) * kKRowElems + g * kHeadDim + 8 * (lane & 15);
            *reinterpret_cast<uint4*>(p.dk + at) = z;
            *reinterpret_cast<uint4*>(p.dv + at) = z;
        }
    }
}

// Warp 1 of the producer warpgroup: claims dQ-zeroing units (group-major, so the groups the
// consumers need first are zeroed first) until none is left, and publishes each unit's zeros to
// the issuers by a release add on its group's count. Bulk stores of a zeroed shared buffer, not
// the warp's own stores: those share the load/store pipe with the consumers' shared-memory
// stores (dS^T, dQ staging) and cost the main kernel more than the memset (run 143). Group 0 is
// zeroed at once (the first reduce-adds wait for it); group g > 0 is paced by the items handed
// out, its units spread over the first kDqZeroPaceNum / kDqZeroPaceDen of the items between the
// previous group's first one and its own, rather than stored in one burst at the start (+0.3%,
// run 146). Every item before a threshold belongs to an earlier group (first claim indices are
// suffix minima), whose units were claimed first: the waits cannot close a cycle.
template <bool kDet>
__device__ __forceinline__ void zero_dq_groups(const Params& p, Smem<kDet>& sm) {
    const int lane = threadIdx.x & 31, per_group = dq_zero_units(p.varlen);
    const int units = kGroups * per_group;
#pragma unroll
    for (int i = 0; i < kDqChunk / 4 / 32; ++i)
        reinterpret_cast<float4*>(sm.zeros)[32 * i + lane] = make_float4(0.f, 0.f, 0.f, 0.f);
    fence_proxy_async_smem();
    __syncwarp();
    if (lane != 0) return;
    int bound[kGroups];  // bound[g]: no item before it belongs to group g or a later one
    bound[kGroups - 1] = p.group_first[kGroups - 1];
#pragma unroll
    for (int g = kGroups - 2; g >= 0; --g) bound[g] = min(bound[g + 1], p.group_first[g]);
    for (int u = atomicAdd(p.zero_claim, 1); u < units; u = atomicAdd(p.zero_claim, 1)) {
        const int g = u / per_group, k = u % per_group, t0 = k * kDqZeroTokens;
        if (g > 0) {
            const int lo = bound[g - 1], span = bound[g] - lo;
            const int at = lo + static_cast<int>(static_cast<int64_t>(span) * kDqZeroPaceNum * (k + 1) /
                                                 (static_cast<int64_t>(kDqZeroPaceDen) * per_group));
            while (static_cast<int>(gridDim.x) + ld_relaxed_gpu(p.claim) < at) __nanosleep(500);
        }
        const int t1 = min(p.varlen.total_q, t0 + kDqZeroTokens);
        for (int t = t0; t < t1; ++t)
            bulk_store(p.dq_accum + (static_cast<int64_t>(t) * kGroups + g) * kDqChunk, sm.zeros, kDqChunk * 4);
        bulk_commit();
        bulk_wait_all();
        fence_proxy_async_global();
        red_release_gpu_add(p.zero_done + g, 1);
    }
}

// Warp 0 of the producer warpgroup. Lanes 0..3 read the tile's CSR entries; lane 0 issues.
template <bool kDet>
__device__ __forceinline__ void producer(Smem<kDet>& sm, const Params& p, const CUtensorMap* qmap, const CUtensorMap* omap,
                                         const CUtensorMap* kmap, const CUtensorMap* vmap) {
    const int lane = threadIdx.x & 31;
    const MsaVarlen& vl = p.varlen;
    const int n_items = p.counts[0];
    int it = blockIdx.x, tile_it = 0;
    for (int item_it = 0;; ++item_it) {
        const bool done = it >= n_items;
        const int4 item = done ? make_int4(-1, 0, 0, 0) : p.items[it];
        const int g = item.x, pb = item.y;
        if (lane == 0) {
            mbar_wait(&sm.kv_empty, (item_it & 1) ^ 1);
            sm.item = item;
            if (done) {
                mbar_arrive(&sm.kv_full);  // the sentinel: no loads, the arrival completes the phase
            } else {
                const BlockKeys bk = block_keys(vl, pb);
                mbar_arrive_expect_tx(&sm.kv_full, 2 * kKvBytes);
                for (int half = 0; half < 2; ++half) {
                    tma_load_2d(sm.k + half * kKvHalf, kmap, &sm.kv_full, g * kHeadDim + 64 * half, bk.start);
                    tma_load_2d(sm.v + half * kKvHalf, vmap, &sm.kv_full, g * kHeadDim + 64 * half, bk.start);
                }
            }
        }
        if (done) break;
        const BlockKeys bk = block_keys(vl, pb);
        for (int e = item.z; e < item.w; e += kTileQueries, ++tile_it) {
            const int st = tile_it % kStages;
            int t, nv;
            tile_entry(p, g, e, item.w, bk.count, lane, t, nv);
            TileInfo info;
#pragma unroll
            for (int s = 0; s < kTileQueries; ++s) {
                info.t[s] = __shfl_sync(0xffffffffu, t, s);
                info.nv[s] = __shfl_sync(0xffffffffu, nv, s);
            }
            if (lane == 0) {
                mbar_wait(&sm.q_empty[st], ((tile_it / kStages) & 1) ^ 1);
                sm.info[st] = info;
                int valid = 0;
#pragma unroll
                for (int s = 0; s < kTileQueries; ++s) valid += info.t[s] >= 0;
                constexpr int kRowFloats = kDet ? 3 : 2;  // lse, delta (kDet: the dQ grid)
                mbar_arrive_expect_tx(&sm.q_full[st], 2 * kQBytes + valid * kRowFloats * kHeadsPerGroup * 4);
#pragma unroll
                for (int s = 0; s < kTileQueries; ++s) {
                    // An empty slot loads the rows past T: zeros, so 0 * dO stays 0 in dV.
                    const int z = info.t[s] >= 0 ? info.t[s] : vl.total_q;
                    for (int half = 0; half < 2; ++half) {
                        tma_load_3d(sm.q[st] + half * kQHalf + s * kTokenBytes, qmap, &sm.q_full[st], 64 * half,
                                    g * kHeadsPerGroup, z);
                        tma_load_3d(sm.dout[st] + half * kQHalf + s * kTokenBytes, omap, &sm.q_full[st], 64 * half,
                                    g * kHeadsPerGroup, z);
                    }
                    if (info.t[s] >= 0) {
                        const int64_t row = static_cast<int64_t>(info.t[s]) * kHeads + g * kHeadsPerGroup;
                        bulk_load(&sm.lse[st][s * kHeadsPerGroup], p.lse + row, kHeadsPerGroup * 4, &sm.q_full[st]);
                        bulk_load(&sm.delta[st][s * kHeadsPerGroup], p.delta + row, kHeadsPerGroup * 4,
                                  &sm.q_full[st]);
                        if constexpr (kDet)
                            bulk_load(&sm.step[st][s * kHeadsPerGroup], p.dq_step + row, kHeadsPerGroup * 4,
                                      &sm.q_full[st]);
                    }
                }
            }
            __syncwarp();
        }
        // The next item, claimed once this one's last tile is issued: the atomic's latency hides
        // behind the tiles still in the ring.
        int next = 0;
        if (lane == 0) next = static_cast<int>(gridDim.x) + atomicAdd(p.claim, 1);
        it = __shfl_sync(0xffffffffu, next, 0);
    }
}
#endif  // MSA_SM90A_ENABLED

namespace {  // internal linkage: each including translation unit launches its own

template <bool kDet>
__global__ void __launch_bounds__(kThreads, 1)
    backward_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap omap,
                    const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap, const Params p) {
#if MSA_SM90A_ENABLED
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if ((smem_u32(smem_raw) & 1023u) != 0) __trap();
    Smem<kDet>& sm = *reinterpret_cast<Smem<kDet>*>(smem_raw);
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        tma_prefetch_map(&qmap);
        tma_prefetch_map(&omap);
        tma_prefetch_map(&kmap);
        tma_prefetch_map(&vmap);
        mbar_init(&sm.kv_full, 1);
        mbar_init(&sm.kv_empty, kConsumerThreads);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&sm.q_full[s], 1);
            mbar_init(&sm.q_empty[s], kConsumerThreads);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp < 4) {
        regs_dealloc<kProducerRegs>();
        if (warp == 0) producer<kDet>(sm, p, &qmap, &omap, &kmap, &vmap);
        if (warp >= 2) zero_unselected(p, warp - 2, 2);
        if (warp == 1) zero_dq_groups(p, sm);
    } else {
        regs_alloc<kConsumerRegs>();
        consumer<kDet>(sm, p, warp / 4 - 1);
    }
#endif
}

__device__ __forceinline__ void add4(float4& a, const float4 b) {
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
}

// Per (physical block pb, group g): a row split over items casts its dkv_acc slot to bf16 (with
// split_part, the deterministic mode: the sum of its items' parts, in id order); a row owned by
// one item was written by it; an empty row (nobody selected the block) was zeroed by the main
// kernel, or is zeroed here when `zero_empty` (the main kernel did not run: no query).
// 128 threads (t = 0..127): 16 threads per key row (16 bytes of dK and dV each), 8 rows a pass.
__device__ __forceinline__ void finish_dkv_row(const int32_t* __restrict__ phys_row_ptr,
                                               const int32_t* __restrict__ split_slot,
                                               const int32_t* __restrict__ split_part, const float* __restrict__ dkv_acc,
                                               const MsaVarlen& varlen, bool zero_empty, uint16_t* __restrict__ dk,
                                               uint16_t* __restrict__ dv, int pb, int g, int t) {
    const BlockKeys bk = block_keys(varlen, pb);
    const int32_t* row_ptr = phys_row_ptr + static_cast<int64_t>(g) * (varlen.padded_kv_blocks + 1);
    const int len = row_ptr[pb + 1] - row_ptr[pb];
    const bool empty = len == 0;
    const int slot = split_slot[g * varlen.padded_kv_blocks + pb];
    if (empty ? !zero_empty : slot < 0) return;
    int64_t first = slot;
    int parts = 1;
    if (split_part != nullptr && !empty) {
        first = split_part[g * varlen.padded_kv_blocks + pb];
        parts = (len + kKvItemQueries - 1) / kKvItemQueries;
    }
    const int d = 8 * (t & 15);
    for (int key = t >> 4; key < bk.count; key += kBlock / 16) {
        uint4 kw = make_uint4(0, 0, 0, 0), vw = kw;
        if (!empty) {
            const float* acc = dkv_acc + (first * 2 * kBlock + key) * kHeadDim + d;
            float4 k0 = *reinterpret_cast<const float4*>(acc), k1 = *reinterpret_cast<const float4*>(acc + 4);
            float4 v0 = *reinterpret_cast<const float4*>(acc + kBlock * kHeadDim);
            float4 v1 = *reinterpret_cast<const float4*>(acc + kBlock * kHeadDim + 4);
            for (int j = 1; j < parts; ++j) {  // in id order: the same sum on every run
                const float* x = acc + static_cast<int64_t>(j) * 2 * kBlock * kHeadDim;
                add4(k0, *reinterpret_cast<const float4*>(x));
                add4(k1, *reinterpret_cast<const float4*>(x + 4));
                add4(v0, *reinterpret_cast<const float4*>(x + kBlock * kHeadDim));
                add4(v1, *reinterpret_cast<const float4*>(x + kBlock * kHeadDim + 4));
            }
            kw = make_uint4(pack_bf16_host(k0.x, k0.y), pack_bf16_host(k0.z, k0.w), pack_bf16_host(k1.x, k1.y),
                            pack_bf16_host(k1.z, k1.w));
            vw = make_uint4(pack_bf16_host(v0.x, v0.y), pack_bf16_host(v0.z, v0.w), pack_bf16_host(v1.x, v1.y),
                            pack_bf16_host(v1.z, v1.w));
        }
        const int64_t out = (static_cast<int64_t>(bk.start) + key) * kKRowElems + g * kHeadDim + d;
        *reinterpret_cast<uint4*>(dk + out) = kw;
        *reinterpret_cast<uint4*>(dv + out) = vw;
    }
}

// What follows the main kernel, in one launch (the two parts are independent, so the many
// (block, group) CTAs that exit at once no longer cost a launch and a pass of their own): the
// first finish_ctas CTAs finish dK/dV, two (block, group) rows each, (pb, g) = (r % P, r / P) for
// row r; the rest cast dQ (dq_fragments.cuh). kCastThreads = 2 x 128 threads.
static_assert(kCastThreads == 2 * kBlock, "a finish CTA is two rows of 128 threads");
inline unsigned finish_ctas(int padded_kv_blocks) { return static_cast<unsigned>(kGroups * padded_kv_blocks + 1) / 2; }

__global__ void __launch_bounds__(kCastThreads)
    backward_epilogue_kernel(const int32_t* __restrict__ phys_row_ptr, const int32_t* __restrict__ split_slot,
                             const int32_t* __restrict__ split_part, const float* __restrict__ dkv_acc,
                             const MsaVarlen varlen, bool zero_empty,
                             uint16_t* __restrict__ dk, uint16_t* __restrict__ dv, unsigned n_finish,
                             const float* __restrict__ dq_accum, uint16_t* __restrict__ dq) {
    if (blockIdx.x >= n_finish) {
        cast_dq_chunks(dq_accum, dq, static_cast<int64_t>(blockIdx.x - n_finish));
        return;
    }
    const int P = varlen.padded_kv_blocks;
    const int r = 2 * static_cast<int>(blockIdx.x) + static_cast<int>(threadIdx.x / kBlock);
    if (r < kGroups * P)
        finish_dkv_row(phys_row_ptr, split_slot, split_part, dkv_acc, varlen, zero_empty, dk, dv, r % P, r / P,
                       static_cast<int>(threadIdx.x % kBlock));
}

// Zeroes the dK/dV slots in use (counts[1] of them, a device count). Grid-stride, any grid.
__global__ void backward_zero_slots_kernel(const int32_t* __restrict__ counts, float4* __restrict__ dkv_acc) {
    const int64_t n = static_cast<int64_t>(counts[1]) * 2 * kBlock * kHeadDim / 4;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dkv_acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace

// Persistent CTAs of the main kernel for `capacity` items on `sms` SMs (one per SM); the item
// build's claim-order tail is made for this grid.
inline int backward_grid(int capacity, int sms) { return capacity < sms ? capacity : sms; }

// Whether launch_backward launches the main kernel (which zeroes the unselected dK/dV rows and the
// dQ accumulator): whenever total_q > 0, as capacity > 0 then.
inline bool backward_launches(int capacity, int total_q) { return capacity > 0 && total_q > 0; }

// Encodes the maps and launches backward_grid persistent CTAs (the item count is read on the
// device). dq_accum accumulates (the kernel zeroes it first) and so does dkv_acc unless kDet
// (zero it first); delta = rowsum(dout * out). kDet: the dQ grid of backward_det_grid.cuh. Run
// backward_epilogue_kernel after it.
template <bool kDet>
inline cudaError_t launch_backward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                                   const Params& p, int capacity, int sms, cudaStream_t stream) {
    const MsaVarlen& vl = p.varlen;
    if (!backward_launches(capacity, vl.total_q)) return cudaSuccess;
    CUtensorMap qmap, omap, kmap, vmap;
    {
        // q, dout [T, 64, 128]: boxes of one query's 16 heads x 64 d.
        const uint64_t dims[3] = {kHeadDim, kHeads, static_cast<uint64_t>(vl.total_q)};
        const uint64_t strides[2] = {kHeadDim * 2, kHeads * kHeadDim * 2};
        const uint32_t box[3] = {64, kHeadsPerGroup, 1};
        cudaError_t e = sm90::encode_bf16_sw128(&qmap, q, 3, dims, strides, box);
        if (e == cudaSuccess) e = sm90::encode_bf16_sw128(&omap, dout, 3, dims, strides, box);
        if (e != cudaSuccess) return e;
    }
    {
        const uint64_t dims[2] = {kGroups * kHeadDim, static_cast<uint64_t>(vl.total_k > 0 ? vl.total_k : 1)};
        const uint64_t strides[1] = {kGroups * kHeadDim * 2};
        const uint32_t box[2] = {64, kBlock};
        cudaError_t e = sm90::encode_bf16_sw128(&kmap, k, 2, dims, strides, box);
        if (e == cudaSuccess) e = sm90::encode_bf16_sw128(&vmap, v, 2, dims, strides, box);
        if (e != cudaSuccess) return e;
    }
    cudaError_t e =
        cudaFuncSetAttribute(backward_kernel<kDet>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<kDet>);
    if (e != cudaSuccess) return e;
    backward_kernel<kDet><<<backward_grid(capacity, sms), kThreads, kSmemBytes<kDet>, stream>>>(qmap, omap, kmap, vmap, p);
    return cudaGetLastError();
}

}  // namespace msa::bwd90
