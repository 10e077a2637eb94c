// Sparse attention forward for Hopper (sm_90a): the "F1" shared-selection kernel of
// docs/perf/attention-forward-sm90.md. A work item is (KV group g, tile of 8 consecutive packed
// queries), 128 rows = 8 queries x the group's 16 heads; it runs one online softmax over the
// tile's block union, so every K/V block is loaded once per tile and each 128 x 128 block
// product is one pair of wgmma chains.
//
// Warp specialization (FlashAttention-3's structure): 384 threads, warpgroup 0 is the producer,
// warpgroups 1 and 2 are consumers owning rows 0-63 (queries 0-3) and 64-127 (queries 4-7). In
// the producer, warp 1 (the builder; with kBuilders = 2 also warp 3, see shared_builder) claims
// items and builds each one's union (build_union_warp) a tile ahead, lane 0 of warp 2 (the Q loader) issues each tile's Q load into one of two
// buffers, and lane 0 of warp 0 (the K/V loader) the loads of K and V per union block into
// 2-stage rings. In the m64 accumulator layout warp w of a consumer holds rows
// 16w..16w+15: one query's 16 heads, so the causal and selection masks are warp-uniform (a query
// that did not choose a union block gets P = 0 for it). S = QK^T is an SS wgmma chain; O += PV
// takes P from registers (RS). S of block j+1 is issued together with PV of block j, across tile
// boundaries too, and the softmax of j+1 runs while PV is in flight; the two consumers take turns
// issuing (pingpong, named barriers 1 and 2) so one warpgroup's softmax hides behind the other's
// matrix products.
//
// Persistent: gridDim.x CTAs claim items in their natural order (group-major, tiles ascending,
// so CTAs working at the same time share K/V blocks in L2), the first by CTA index and the rest
// from a counter, so they finish within about one item of each other without a sorted run list.
// With two builders (short fragments) the counter walks an order written before the launch
// (order_kernel) that leaves a document's first-block tiles, the smallest, for the last claims.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "msa/attention.h"
#include "msa/common.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "common/varlen.cuh"
#include "common/sm90/arch.cuh"
#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/wgmma.cuh"
#include "attention/block_union.cuh"


namespace msa::fwd90 {

constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;  // two consumer warpgroups; each arrives on an "empty" barrier
// K runs one block ahead of V in the producer; a third K stage measured within noise (run 7).
constexpr int kStagesK = 2;
constexpr int kStagesV = 2;
constexpr int kRows = kQueriesPerCta * kHeadsPerGroup;     // 128
constexpr int kHalfBytes = kRows * 64 * 2;                 // one 64-column half of a 128-row tile
constexpr int kTileBytes = 2 * kHalfBytes;                 // 32 KiB
constexpr int kWgRowBytes = 64 * 128;                      // 64 rows of one half
constexpr int kOutStageBytes = kHeadsPerGroup * kHeadDim * 2;  // one query's 16 heads, two 64-d halves

// One union block as build_union_warp lists it: (physical block, packed K row of key 0, stored
// keys, mask of the tile queries that chose it).
using StageInfo = int4;

// One tile from the builder to the loaders (slot n % kSlots, so the builder runs up to kSlots
// tiles ahead) and from the Q loader to the consumers (tile n % 2, beside Q buffer n % 2): the
// claimed item, its union size (-1: no more items) and its queries' workspace positions (-1 past
// T).
constexpr int kSlots = 4;
// The builder claims its next item only while fewer than kAheadBlocks union blocks it built wait
// for their K load: claims then stay within a few blocks of the consumers, so the CTAs' last
// claims balance as a dynamic schedule should (claiming as soon as a slot frees held up to six
// tiles per CTA, and the random pattern's mid rows lost 8-14% to the CTAs left idle at the end:
// run 67, same SM active cycles, 1.19x the duration).
constexpr int kAheadBlocks = 8;
// Rows whose fragments span at most kShortDocBlocks KV blocks on average (MsaVarlen::total_rows)
// run the kernel with two builders (kBuilders = 2, warps 1 and 3): there tiles have 1-3 union
// blocks, one builder's chain of dependent global loads sets the pace (run 82: it never slept, the
// loader waited for it) and a second gives +10% (434/r0, mean 2.4 blocks; runs 85-91). Elsewhere
// it costs 1-6% (runs 87, 88, 91: the next row has 5.9), so one builder runs there.
constexpr int kShortDocBlocks = 4;
// Two builders gate their claims at kAheadShort blocks: tiles there last ~4 us, so every tile a
// CTA holds when the counter runs out lengthens the tail; 4 measured best on 434/r0 (+0.4-0.7%
// over 8 in runs 101-102; 2: -1.2%, 3: -0.4%, 6: +0.2%, 12: -0.4%). An item claimed and not yet
// built counts kClaimWeight blocks against it, so a CTA does not hold two extra long tiles at the
// end (run 67's imbalance); the second builder claims only while the first falls behind on tiles
// of few blocks: while the first is not done, it waits while kHelpBelow or more built blocks wait
// for the loader or while the last union built had more than kHelpUnion blocks (its first claim
// too).
constexpr int kAheadShort = 4;
constexpr int kClaimWeight = kAheadShort / 2;
constexpr int kHelpBelow = 2;
constexpr int kHelpUnion = 3;
// Two builders claim items in an order order_kernel writes in the counter memset's place: natural
// order, except that up to kDeferWaves x gridDim.x first-block tiles (all 8 queries in their
// document's first block: a union of one block) among the first kOrderThreads claims go last, so
// the CTAs' last claims are small and they end closer together (run 110: the SMs' active-cycle
// spread 16.4 / 11.8 kcycles against 18.1 / 20.6). Classifying tiles in the claim path instead
// cost more than the end gained (runs 108-112); here a claim is the counter's add and one load.
constexpr int kDeferWaves = 2;
constexpr int kOrderThreads = 1024;  // order_kernel's one CTA: one claim of the window per thread
struct TileSlot {
    int item, u;
    int g, t0;  // the item's group and first query, from the builder (no division per tile in the consumers)
    int wpos[kQueriesPerCta];
};

struct Smem {
    uint8_t q[2][kTileBytes];
    uint8_t k[kStagesK][kTileBytes];
    uint8_t v[kStagesV][kTileBytes];
    uint8_t ostage[8][kOutStageBytes];  // per consumer warp: its query's O for the TMA store
    StageInfo info[kStagesK];
    union {
        StageInfo list[kUnionMax];  // one builder: the K/V loader's copy of the current tile's union
        uint32_t keys[kUnionMax];   // two: the second builder's sorted keys (the loader walks by shuffles)
    } scratch;
    alignas(16) uint32_t keys[kUnionMax];  // the (first) builder's sorted keys
    TileSlot slot[kSlots];
    TileSlot tile[2];
    int loaded;  // union blocks whose K load the loader issued (its lane 0 stores, the builders poll;
                 // shared-memory atomics, so racecheck sees no unsynchronized access)
    uint64_t slot_full[kSlots], slot_empty[kSlots];
    uint64_t q_full[2], q_empty[2];
    uint64_t k_full[kStagesK], k_empty[kStagesK], v_full[kStagesV], v_empty[kStagesV];
    // Two builders' shared state (shared-memory atomics): union blocks built plus kClaimWeight per
    // item claimed and not yet built, blocks built, the last union's size, the next slot index,
    // builders out of items. Last, so one builder's layout is the same without it.
    int ahead, built, last_u, next_slot, finished;
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem));
static_assert(kSmemBytes <= kMaxSmemSm90, "the forward's shared memory fits a block");

struct Params {
    const int32_t* topk;  // [4, T, 16]
    int4* entries;        // [4, tiles, 128]: each item's union, written by its builder
    int* claim;           // items claimed past the first gridDim.x; zero at launch
    MsaVarlen varlen;
    uint16_t* out;
    float* lse;
    int tiles;
    int* order;  // [items - gridDim.x]: the item claim j takes (written by order_kernel; two builders only)
};

#if MSA_SM90A_ENABLED
using namespace msa::sm90;

// 2^x by the MUFU unit, denormal results flushed (exp2f adds range fix-ups around it).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

constexpr float kLazyLog2 = 8.f;  // RowSoftmax::step: P stays <= 256 between max moves
constexpr float kLazyRaw = kLazyLog2 / kScaleLog2e;  // the same margin in raw scores

// Row state of one thread: rows r0 = lane/4 and r1 = r0 + 8 of its warp.
struct RowSoftmax {
    float m[2];  // running max of raw scores
    float l[2];  // this thread's share of the running sum

    __device__ __forceinline__ void init() {
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
    }

    // Masks columns >= n_visible, updates the running max, turns s into P (fp32) and returns
    // the factors that rescale O in corr, which holds softmax()'s 1 (0 for a row with no visible
    // key yet) on entry and changes only where the max moves. Call only when n_visible > 0 (then
    // every row has a visible key, so the new max is finite). The max moves only when a row of
    // the warp grew past it by more than 2^kLazyLog2 in P's scale (FlashAttention-4's lazy
    // rescaling): P <= 2^kLazyLog2 meanwhile, exact since O and l share the max, and rescale()
    // skips O's 64 multiplies on most blocks (with a strict max, block j of i.i.d. scores moves
    // each row's max with probability 1/j, so one of a warp's 16 rows almost always does).
    // Returns whether O must be rescaled (warp-uniform).
    // The work follows n_visible (warp-uniform: one query per warp): a query that sees at most
    // the block's first 32 or 64 keys (its own block's first quarter or half, or a document's
    // short last block) takes a form over those columns alone, the rest neither read nor written
    // (to_p() gives them P = 0), and each form masks only the chunks n_visible can end in. S and
    // PV keep their full shapes: the tensor pipe has slack where documents are short, and a
    // wgmma shape chosen at run time serializes every wgmma of the kernel (session 19).
    __device__ __forceinline__ bool step(float (&s)[64], int n_visible, float (&corr)[2]) {
        if (n_visible <= kBlock / 4) return step_cols<4, 0>(s, n_visible, corr);
        return n_visible <= kBlock / 2 ? step_cols<8, 4>(s, n_visible, corr) : step_cols<16, 8>(s, n_visible, corr);
    }

    // step() over the first kChunks 8-column chunks of s, for 8 * kMasked < n_visible: the
    // chunks before kMasked hold no masked column.
    template <int kChunks, int kMasked>
    __device__ __forceinline__ bool step_cols(float (&s)[64], int n_visible, float (&corr)[2]) {
        const int c = 2 * (threadIdx.x & 3);
        if (n_visible < 8 * kChunks) {
#pragma unroll
            for (int i = kMasked; i < kChunks; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (8 * i + c + e >= n_visible) s[4 * i + e] = s[4 * i + 2 + e] = -INFINITY;
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        // -inf (no visible key yet) always moves: corr 0 restarts O and l.
        const bool move = __any_sync(0xffffffffu, mx[0] > m[0] + kLazyRaw || mx[1] > m[1] + kLazyRaw);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // Selects, not a branch: the previous block's PV may be in flight on O.
            corr[r] = move ? ex2((m[r] - mx[r]) * kScaleLog2e) : corr[r];
            m[r] = move ? mx[r] : m[r];
            l[r] *= corr[r];
        }
        const float mb0 = m[0] * kScaleLog2e, mb1 = m[1] * kScaleLog2e;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
            s[4 * i] = ex2(fmaf(s[4 * i], kScaleLog2e, -mb0));
            s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], kScaleLog2e, -mb0));
            s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], kScaleLog2e, -mb1));
            s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], kScaleLog2e, -mb1));
            sum0 += s[4 * i] + s[4 * i + 1];
            sum1 += s[4 * i + 2] + s[4 * i + 3];
        }
        l[0] += sum0;
        l[1] += sum1;
        return move;
    }
};

// P's first kSteps k-steps (16 keys each) from p; the rest are left to the caller.
template <int kSteps = 8>
__device__ __forceinline__ void to_a_frags(const float (&p)[64], uint32_t (&a)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
        a[kk][0] = pack_bf16(p[8 * kk], p[8 * kk + 1]);
        a[kk][1] = pack_bf16(p[8 * kk + 2], p[8 * kk + 3]);
        a[kk][2] = pack_bf16(p[8 * kk + 4], p[8 * kk + 5]);
        a[kk][3] = pack_bf16(p[8 * kk + 6], p[8 * kk + 7]);
    }
}

// Skipped (exactly: the factors are 1) unless the warp's softmax said otherwise (warp-uniform).
__device__ __forceinline__ void rescale(float (&o)[64], const float (&corr)[2], bool need) {
    if (!need) return;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        o[4 * i] *= corr[0];
        o[4 * i + 1] *= corr[0];
        o[4 * i + 2] *= corr[1];
        o[4 * i + 3] *= corr[1];
    }
}

// S = Q K^T for this warpgroup's 64 rows: 8 k-steps of 16 head dims, 4 per 64-column half.
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_addr, uint32_t k_addr) {
    const uint64_t qd = sw128_desc_uniform(q_addr, 16, 1024), kd = sw128_desc_uniform(k_addr, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t off = (ks >> 2) * kHalfBytes + (ks & 3) * 32;
        wgmma_m64n128k16_ss<0>(s, desc_advance(qd, off), desc_advance(kd, off), ks > 0);
    }
}

// O += P V: 8 k-steps of 16 keys; V is MN-major (rows = keys), its second 64-d half at LBO.
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&p)[8][4], uint32_t v_addr) {
    const uint64_t vd = sw128_desc_uniform(v_addr, kHalfBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_m64n128k16_rs<1>(o, p[kk], desc_advance(vd, kk * 2048), 1);
}

// Named barriers 1 + w: consumer warpgroup w may issue its matrix products.
__device__ __forceinline__ void turn_wait(int wg) { named_sync(1 + wg, 256); }
__device__ __forceinline__ void turn_pass(int wg) { named_arrive(1 + (wg ^ 1), 256); }

// Sorts the warp's 128 keys ascending, lane l holding keys 4 l .. 4 l + 3: a bitonic network in
// registers (pairs 4 or more keys apart by shuffles across lanes, nearer ones within a lane),
// 28 compare-exchange steps.
__device__ __forceinline__ void warp_sort128(uint32_t (&k)[4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int size = 2; size <= 128; size <<= 1) {
        const bool up = ((4 * lane) & size) == 0;  // this lane's keys sort ascending (size >= 4)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (stride >= 4) {
                const int lanes = stride >> 2;
                const bool keep_min = ((lane & lanes) != 0) != up;  // the pair's lower key keeps the min going up
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const uint32_t other = __shfl_xor_sync(0xffffffffu, k[r], lanes);
                    k[r] = keep_min ? min(k[r], other) : max(k[r], other);
                }
            } else {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int q = r ^ stride;
                    if (q < r) continue;
                    const bool asc = size == 2 ? (r & 2) == 0 : up;
                    const uint32_t lo = min(k[r], k[q]), hi = max(k[r], k[q]);
                    k[r] = asc ? lo : hi;
                    k[q] = asc ? hi : lo;
                }
            }
        }
    }
}

// The union of one item's selections, built by one warp. Lane l reads query l / 4's top-k slots
// 4 (l % 4) .. + 3 as keys (physical block << 3 | query; kNone for a slot outside the contract's
// valid range), the warp sorts them, and a key is its block's first occurrence when the key below
// holds another block: its rank among the distinct blocks comes from ballots, its query mask from
// the run of equal blocks above it (in `keys`, shared memory). Writes out[0, n) ascending by block
// and the queries' workspace positions into wpos; returns n (warp-uniform). ~600 instructions a
// tile; the two O(n^2) passes of the first version cost ~5,000 and slowed the forward (run 63).
__device__ __forceinline__ int build_union_warp(uint32_t* keys, const int32_t* __restrict__ topk, const MsaVarlen& v,
                                                int g, int t0, int4* __restrict__ out, int* wpos) {
    constexpr uint32_t kNone = 0xFFFFFFFFu;  // sorts last; block 2^29 - 1 is past any workspace
    const int lane = threadIdx.x & 31;
    const int qi = lane >> 2, t = t0 + qi;
    uint32_t k[4] = {kNone, kNone, kNone, kNone};
    if (t < v.total_q) {
        const int32_t* row = topk + (static_cast<int64_t>(g) * v.total_q + t) * kTopK + 4 * (lane & 3);
        const QueryCoord c = query_coord(v, t);
        const int last = c.pos / kBlock;  // the contract's valid range, as the v1 union keeps it
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int e = row[r];
            if (e >= 0 && e <= last) k[r] = (static_cast<uint32_t>(c.phys_base + e) << 3) | static_cast<uint32_t>(qi);
        }
        if ((lane & 3) == 0) wpos[qi] = c.phys_base * kBlock + c.pos;
    } else if ((lane & 3) == 0) {
        wpos[qi] = -1;
    }
    warp_sort128(k);
    uint32_t below = __shfl_up_sync(0xffffffffu, k[3], 1);
    if (lane == 0) below = kNone;
    bool first[4];
    int rank = 0, n = 0;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const uint32_t prev = r > 0 ? k[r - 1] : below;
        first[r] = k[r] != kNone && (k[r] >> 3) != (prev >> 3);
        const unsigned firsts = __ballot_sync(0xffffffffu, first[r]);
        rank += __popc(firsts & ((1u << lane) - 1u));
        n += __popc(firsts);
    }
    __syncwarp();  // the previous item's run scans have read keys
    reinterpret_cast<uint4*>(keys)[lane] = make_uint4(k[0], k[1], k[2], k[3]);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        if (!first[r]) continue;
        const uint32_t block = k[r] >> 3;
        unsigned mask = 0u;
        for (int i = 4 * lane + r; i < kUnionMax && (keys[i] >> 3) == block; ++i) mask |= 1u << (keys[i] & 7u);
        const BlockKeys bk = block_keys(v, static_cast<int>(block));
        out[rank++] = make_int4(static_cast<int>(block), bk.start, bk.count, static_cast<int>(mask));
    }
    return n;
}

// Warp 1 of the producer warpgroup: claims items in natural order, the first by CTA index and
// the rest from the counter (fetched while the current union is built), builds each union and
// hands tile n over in slot n % kSlots once the loader has taken tile n - kSlots from it.
__device__ __forceinline__ void builder(Smem& sm, const Params& p) {
    const int lane = threadIdx.x & 31;
    const int items = kGroups * p.tiles;
    int item = blockIdx.x, built = 0;
    for (int n = 0;; ++n) {
        const int b = n % kSlots;
        mbar_wait(&sm.slot_empty[b], ((n / kSlots) & 1) ^ 1);
        TileSlot& slot = sm.slot[b];
        if (item >= items) {
            if (lane == 0) {
                slot.item = 0;
                slot.u = -1;
            }
            __syncwarp();
            mbar_arrive(&sm.slot_full[b]);
            return;
        }
        const int g = item / p.tiles, t0 = (item - g * p.tiles) * kQueriesPerCta;
        const int u = build_union_warp(sm.keys, p.topk, p.varlen, g, t0,
                                       p.entries + static_cast<int64_t>(item) * kUnionMax, slot.wpos);
        if (lane == 0) {
            slot.item = item;
            slot.u = u;
            slot.g = g;
            slot.t0 = t0;
        }
        __syncwarp();
        mbar_arrive(&sm.slot_full[b]);  // per lane: its entries and positions are written
        int next = 0;
        if (lane == 0) {
            built += u;
            while (built - atomicAdd(&sm.loaded, 0) >= kAheadBlocks) __nanosleep(256);
            next = static_cast<int>(gridDim.x) + atomicAdd(p.claim, 1);
        }
        item = __shfl_sync(0xffffffffu, next, 0);
    }
}

// Warps 1 and 3 of the producer warpgroup with kBuilders = 2 (builder `id`): each claims items in
// natural order (the first builder's first by CTA index, every other from the counter), takes the
// next slot index, builds the item's union into it once the loaders have taken the tile kSlots
// before, and hands it over. The loaders take slots in index order, so a slot index is taken only
// after the item is claimed, and a builder holds at most one slot unpublished: the lower of the
// two unpublished slots never waits on the other. The builder that runs out of items second
// publishes the sentinel, after every tile of both (the first one's last slot was taken before it
// finished). scripts/analysis/builders_model.py checks this protocol.
__device__ __forceinline__ void shared_builder(Smem& sm, const Params& p, int id) {
    const int lane = threadIdx.x & 31;
    const int items = kGroups * p.tiles;
    const int claims = items - static_cast<int>(gridDim.x);
    uint32_t* keys = id == 0 ? sm.keys : sm.scratch.keys;
    bool ordered = false;  // lane 0: order_kernel has completed
    auto claim = [&]() -> int {  // lane 0: the next item, counted against the gate until built
        if (!ordered) griddep_wait();
        ordered = true;
        atomicAdd(&sm.ahead, kClaimWeight);
        const int j = atomicAdd(p.claim, 1);
        return j < claims ? __ldcg(p.order + j) : items;
    };
    auto take_slot = [&]() -> int {
        int n = 0;
        if (lane == 0) n = atomicAdd(&sm.next_slot, 1);
        return __shfl_sync(0xffffffffu, n, 0);
    };
    // Lane 0: the claim gate, with the second builder's own conditions (kHelpBelow, kHelpUnion).
    auto gate = [&]() {
        auto helper_waits = [&]() {
            return id == 1 && atomicAdd(&sm.finished, 0) == 0 &&
                   (atomicAdd(&sm.built, 0) - atomicAdd(&sm.loaded, 0) >= kHelpBelow ||
                    atomicAdd(&sm.last_u, 0) > kHelpUnion);
        };
        while (atomicAdd(&sm.ahead, 0) - atomicAdd(&sm.loaded, 0) >= kAheadShort || helper_waits())
            __nanosleep(256);
    };
    int item = 0;
    if (lane == 0 && id == 1) gate();  // last_u starts at kUnionMax: the first claim waits for a small union
    if (lane == 0) item = id == 0 ? static_cast<int>(blockIdx.x) : claim();
    if (lane == 0 && id == 0) atomicAdd(&sm.ahead, kClaimWeight);
    item = __shfl_sync(0xffffffffu, item, 0);
    for (;;) {
        if (item >= items) {
            int last = 0;
            if (lane == 0) {
                atomicAdd(&sm.ahead, -kClaimWeight);  // the claim found no item (else the other builder's
                                                      // gate would count it forever: a deadlock below 3 blocks)
                __threadfence_block();  // this builder's slot indices precede the count
                last = atomicAdd(&sm.finished, 1) == 1;
                __threadfence_block();
            }
            if (!__shfl_sync(0xffffffffu, last, 0)) return;
            const int n = take_slot();
            const int b = n % kSlots;
            mbar_wait(&sm.slot_empty[b], ((n / kSlots) & 1) ^ 1);
            if (lane == 0) {
                sm.slot[b].item = 0;
                sm.slot[b].u = -1;
            }
            __syncwarp();
            mbar_arrive(&sm.slot_full[b]);
            return;
        }
        const int n = take_slot();
        const int b = n % kSlots;
        mbar_wait(&sm.slot_empty[b], ((n / kSlots) & 1) ^ 1);
        TileSlot& slot = sm.slot[b];
        const int g = item / p.tiles, t0 = (item - g * p.tiles) * kQueriesPerCta;
        const int u = build_union_warp(keys, p.topk, p.varlen, g, t0, p.entries + static_cast<int64_t>(item) * kUnionMax,
                                       slot.wpos);
        if (lane == 0) {
            slot.item = item;
            slot.u = u;
            slot.g = g;
            slot.t0 = t0;
        }
        __syncwarp();
        mbar_arrive(&sm.slot_full[b]);  // per lane: its entries and positions are written
        int next = 0;
        if (lane == 0) {
            atomicAdd(&sm.ahead, u - kClaimWeight);
            atomicAdd(&sm.built, u);
            atomicExch(&sm.last_u, u);
            gate();
            next = claim();
        }
        item = __shfl_sync(0xffffffffu, next, 0);
    }
}

// Where a consumer warp's epilogue writes O: the out map (boxes of 64 d x 16 heads x 1 query) and
// the warp's staging buffer in the map's 128-byte-swizzled layout.
struct OutPort {
    const CUtensorMap* map;
    uint8_t* stage;
};

// Normalizes O and writes this warp's query (16 heads x 128) and its LSE; l is the thread's share
// of the row sums. Rows with no visible key get O = 0, LSE = -inf. O goes through the warp's
// staging buffer and two TMA stores (full 128-byte lines; direct stores from the accumulator
// layout wrote 16 bytes into each of 8 rows per instruction).
__device__ __forceinline__ void epilogue(const float (&o)[64], const float (&m)[2], const float (&l_part)[2], int t,
                                         int g, bool valid, const Params& p, const OutPort& op) {
    const int lane = threadIdx.x & 31;
    float l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] = l_part[r];
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (!valid) return;
    const int h0 = g * kHeadsPerGroup + (lane >> 2);
    if (lane == 0) bulk_wait_read_all();  // this warp's previous store has read the buffer
    __syncwarp();
    // 1 / l by the MUFU unit: l >= 1 wherever a key is visible (its maximum contributes 2^0), so
    // the IEEE division's slow path only cost a branch per row.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) inv[r] = l[r] > 0.f ? __fdividef(1.f, l[r]) : 0.f;
    // Columns 8i .. 8i + 7 of rows 8r .. 8r + 7 are the 8x8 matrix (i, r) of the accumulator
    // layout; stmatrix x4 j stores (2j, 0), (2j, 1), (2j + 1, 0), (2j + 1, 1). Lane l addresses row
    // l % 8 of matrix l / 8: staging row 8r + l % 8, its 16-byte chunk i XORed with the row % 8
    // inside i's 64-column half (the out map's 128-byte swizzle).
    const int mr = lane & 7, mm = lane >> 3;
    const uint32_t row_addr = smem_u32(op.stage) + (8 * (mm & 1) + mr) * 128;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = 2 * j + (mm >> 1);
        const uint32_t addr = row_addr + (i >> 3) * (kOutStageBytes / 2) + (((i & 7) ^ mr) << 4);
        stmatrix_x4(addr, pack_bf16(o[8 * j] * inv[0], o[8 * j + 1] * inv[0]),
                    pack_bf16(o[8 * j + 2] * inv[1], o[8 * j + 3] * inv[1]),
                    pack_bf16(o[8 * j + 4] * inv[0], o[8 * j + 5] * inv[0]),
                    pack_bf16(o[8 * j + 6] * inv[1], o[8 * j + 7] * inv[1]));
    }
    if ((lane & 3) == 0) {  // one thread of each row quad
#pragma unroll
        for (int r = 0; r < 2; ++r)
            p.lse[static_cast<int64_t>(t) * kHeads + h0 + 8 * r] = l[r] > 0.f ? m[r] * kScale + __logf(l[r]) : -INFINITY;
    }
    fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) {
        for (int half = 0; half < 2; ++half)
            tma_store_3d(op.map, op.stage + half * (kOutStageBytes / 2), 64 * half, g * kHeadsPerGroup, t);
        bulk_commit();
    }
}

// This warp's query in one item: packed index, group, workspace position (-1 past T).
struct TileQuery {
    int t, g, wpos;
    __device__ __forceinline__ bool valid() const { return wpos >= 0; }
};

// The consumer's view of one stage: waits for K, issues S = QK^T (uncommitted wait), and returns
// how many keys of the block this warp's query sees (0: not chosen, P = 0).
struct ConsumerState {
    Smem& sm;
    uint32_t q_addr;
    float s[64];
    uint32_t pa[8][4];
    RowSoftmax rs;

    __device__ __forceinline__ int qk(int stage, uint32_t phase, const TileQuery& q, int token) {
        mbar_wait(&sm.k_full[stage], phase);
        wgmma_fence();
        issue_qk(s, q_addr, smem_u32(sm.k[stage]));
        wgmma_commit();
        const StageInfo inf = sm.info[stage];
        const bool chose = q.valid() && ((inf.w >> token) & 1);
        return chose ? visible_keys(q.wpos, inf.x, inf.z) : 0;
    }
    // Exponentiates s in place and returns O's rescale factors: 1 when this query skips the
    // block, 0 while the tile has had no visible key yet (so O, still holding the previous
    // tile, restarts from zero at the first PV of the tile); and whether they are not all 1
    // (warp-uniform: the warp's rows get their first visible key at the same block).
    __device__ __forceinline__ bool softmax(int nv, float (&corr)[2]) {
        corr[0] = rs.m[0] == -INFINITY ? 0.f : 1.f;
        corr[1] = rs.m[1] == -INFINITY ? 0.f : 1.f;
        return nv > 0 ? rs.step(s, nv, corr) : rs.m[0] == -INFINITY;
    }
    // P in registers, only once no wgmma still reads the previous P.
    __device__ __forceinline__ void to_p(int nv) {
        if (nv > kBlock / 2) {
            to_a_frags(s, pa);
        } else if (nv > kBlock / 4) {
            to_a_frags<4>(s, pa);
#pragma unroll
            for (int kk = 4; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
        } else {
            if (nv > 0) to_a_frags<2>(s, pa);
#pragma unroll
            for (int kk = 0; kk < 8; ++kk)
                if (nv == 0 || kk >= 2) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
        }
    }
};

__device__ __forceinline__ void zero(float (&o)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
}

// Writes O = 0 and LSE = -inf for this warp's query: a tile whose queries selected nothing.
__device__ __forceinline__ void epilogue_empty(const TileQuery& q, const Params& p, const OutPort& op) {
    const float o[64] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    epilogue(o, m, l, q.t, q.g, q.valid(), p, op);
}

// One continuous stream of (tile, block) pairs over the CTA's non-empty tiles: S of a block is
// issued together with PV of the block before it (of the same or the previous tile), the
// softmax runs while that PV is in flight, and a tile's epilogue runs once its last PV is done,
// after the next tile's first softmax. The two consumer warpgroups alternate their issues
// (pingpong). The issue/wait sequence is straight-line in the loop body: ptxas serializes wgmma
// whose completion it cannot track through data-dependent branches (warning C7518).
__device__ __forceinline__ void consumer_stream(Smem& sm, const Params& p, int wg, const OutPort& op) {
    const int token = 4 * wg + ((threadIdx.x >> 5) & 3);
    int tile_it = 0, kb = 0, vb = 0;  // tiles, K stage uses, V stage uses
    ConsumerState cs{sm};
    cs.rs.init();
    float o[64];
    zero(o);
    float corr[2];
    bool need = false;
    int qb = 0, u = 0;
    TileQuery q{};
    // Moves to the next tile with blocks (tile and Q buffer tile_it % 2), answering the tiles
    // without blocks on the way; false when the builder has no more items.
    auto next_tile = [&]() -> bool {
        for (;;) {
            qb = tile_it & 1;
            mbar_wait(&sm.q_full[qb], (tile_it >> 1) & 1);
            const TileSlot& ts = sm.tile[qb];
            const int su = ts.u;
            if (su < 0) return false;
            q.g = ts.g;
            q.t = ts.t0 + token;
            q.wpos = ts.wpos[token];
            ++tile_it;
            if (su > 0) {
                u = su;
                cs.q_addr = smem_u32(sm.q[qb]) + wg * kWgRowBytes;
                return true;
            }
            mbar_release(&sm.q_empty[qb]);
            epilogue_empty(q, p, op);
        }
    };
    if (wg == 1) turn_pass(wg);  // warpgroup 0 issues first
    if (!next_tile()) return;

    // The first block: S alone.
    int j = 0;
    turn_wait(wg);
    int nv = cs.qk(kb % kStagesK, (kb / kStagesK) & 1, q, token);
    turn_pass(wg);
    wgmma_wait<0>();
    fence_regs(cs.s);
    mbar_release(&sm.k_empty[kb % kStagesK]);
    ++kb;
    if (u == 1) mbar_release(&sm.q_empty[qb]);
    need = cs.softmax(nv, corr);
    cs.to_p(nv);
    TileQuery owner = q;  // the tile o belongs to

    while (true) {
        // Advance to the next (tile, block); at a tile boundary keep the finished tile's
        // statistics (final: its last softmax is done) for its epilogue below.
        bool boundary = false;
        float prev_m[2], prev_l[2];
        if (++j == u) {
            prev_m[0] = cs.rs.m[0];
            prev_m[1] = cs.rs.m[1];
            prev_l[0] = cs.rs.l[0];
            prev_l[1] = cs.rs.l[1];
            if (!next_tile()) break;
            cs.rs.init();
            boundary = true;
            j = 0;
        }
        const int sk = kb % kStagesK, sv = vb % kStagesV;
        turn_wait(wg);
        nv = cs.qk(sk, (kb / kStagesK) & 1, q, token);
        rescale(o, corr, need);
        mbar_wait(&sm.v_full[sv], (vb / kStagesV) & 1);
        wgmma_fence();
        issue_pv(o, cs.pa, smem_u32(sm.v[sv]));
        wgmma_commit();
        turn_pass(wg);
        wgmma_wait<1>();
        fence_regs(cs.s);
        mbar_release(&sm.k_empty[sk]);
        ++kb;
        if (j == u - 1) mbar_release(&sm.q_empty[qb]);  // the tile's last S has read Q
        need = cs.softmax(nv, corr);
        wgmma_wait<0>();
        fence_regs(o);
        mbar_release(&sm.v_empty[sv]);
        ++vb;
        if (boundary) {
            epilogue(o, prev_m, prev_l, owner.t, owner.g, owner.valid(), p, op);
            owner = q;
        }
        cs.to_p(nv);
    }

    // The last block's PV.
    const int sv = vb % kStagesV;
    rescale(o, corr, need);
    mbar_wait(&sm.v_full[sv], (vb / kStagesV) & 1);
    turn_wait(wg);
    wgmma_fence();
    issue_pv(o, cs.pa, smem_u32(sm.v[sv]));
    wgmma_commit();
    turn_pass(wg);
    wgmma_wait<0>();
    fence_regs(o);
    mbar_release(&sm.v_empty[sv]);
    epilogue(o, cs.rs.m, cs.rs.l, owner.t, owner.g, owner.valid(), p, op);
}

// Warp 2 of the producer warpgroup: per tile, lane 0 passes the tile on to the consumers (tile
// n % 2) once they have released tile n - 2, frees its slot and loads Q; a tile without blocks,
// or the end, completes its Q buffer's phase with a plain arrival. Apart from the K/V loader, so
// Q goes out as soon as its buffer frees instead of after the previous tile's K/V loads, which
// wait on the 2-stage ring (run 82: on 434/r0, 1-3 blocks per tile, the consumers waited for Q
// on 9% of the samples).
__device__ __forceinline__ void q_loader(Smem& sm, const Params& p, const CUtensorMap* qmap) {
    const int lane = threadIdx.x & 31;
    for (int n = 0;; ++n) {
        const int b = n % kSlots, qb = n & 1;
        mbar_wait(&sm.slot_full[b], (n / kSlots) & 1);
        const int u = sm.slot[b].u, item = sm.slot[b].item;
        if (lane != 0) {
            mbar_arrive(&sm.slot_empty[b]);  // per lane, after its reads of the slot
        } else {
            mbar_wait(&sm.q_empty[qb], ((n >> 1) & 1) ^ 1);
            sm.tile[qb] = sm.slot[b];
            mbar_arrive(&sm.slot_empty[b]);
            if (u > 0) {
                const int g = item / p.tiles, tile = item - g * p.tiles;
                mbar_arrive_expect_tx(&sm.q_full[qb], kTileBytes);
                for (int half = 0; half < 2; ++half)
                    tma_load_3d(sm.q[qb] + half * kHalfBytes, qmap, &sm.q_full[qb], 64 * half, g * kHeadsPerGroup,
                                tile * kQueriesPerCta);
            } else {
                mbar_arrive(&sm.q_full[qb]);
            }
        }
        if (u < 0) break;
    }
}

// Warp 0 of the producer warpgroup: per tile lane 0 issues the TMA loads of K and V of every
// union block into the 2-stage rings. With one builder the warp first copies the union into
// shared memory; with two (whose second builder sorts in that space) it walks the union together,
// block j's entry from lane j % 32 by shuffles.
template <int kBuilders>
__device__ __forceinline__ void kv_loader(Smem& sm, const Params& p, const CUtensorMap* kmap, const CUtensorMap* vmap) {
    const int lane = threadIdx.x & 31;
    int kb = 0, vb = 0;
    bool v_pending = false;
    int v_col = 0, v_row = 0;
    auto load_v = [&] {
        const int sv = vb % kStagesV;
        mbar_wait(&sm.v_empty[sv], ((vb / kStagesV) & 1) ^ 1);
        mbar_arrive_expect_tx(&sm.v_full[sv], kTileBytes);
        for (int half = 0; half < 2; ++half)
            tma_load_2d(sm.v[sv] + half * kHalfBytes, vmap, &sm.v_full[sv], v_col + 64 * half, v_row);
        ++vb;
    };
    for (int n = 0;; ++n) {
        const int b = n % kSlots;
        mbar_wait(&sm.slot_full[b], (n / kSlots) & 1);
        const int u = sm.slot[b].u, item = sm.slot[b].item;
        mbar_arrive(&sm.slot_empty[b]);  // per lane, after its reads of the slot
        if (u < 0) break;
        const int g = item / p.tiles;
        const int4* entries = p.entries + static_cast<int64_t>(item) * kUnionMax;
        // Lane 0: K of block entry e (and V of the block before it).
        auto load_k = [&](const StageInfo& e) {
            const int sk = kb % kStagesK;
            mbar_wait(&sm.k_empty[sk], ((kb / kStagesK) & 1) ^ 1);
            sm.info[sk] = e;
            mbar_arrive_expect_tx(&sm.k_full[sk], kTileBytes);
            for (int half = 0; half < 2; ++half)
                tma_load_2d(sm.k[sk] + half * kHalfBytes, kmap, &sm.k_full[sk], g * kHeadDim + 64 * half, e.y);
            atomicExch(&sm.loaded, kb + 1);
            // V trails K by one block: the consumers need V of block n only after K of n + 1.
            if (v_pending) load_v();
            v_pending = true;
            v_col = g * kHeadDim;
            v_row = e.y;
        };
        if constexpr (kBuilders == 1) {
            int4 mine[kUnionMax / 32];
#pragma unroll
            for (int r = 0; r < kUnionMax / 32; ++r)
                if (lane + 32 * r < u) mine[r] = entries[lane + 32 * r];
#pragma unroll
            for (int r = 0; r < kUnionMax / 32; ++r)
                if (lane + 32 * r < u) sm.scratch.list[lane + 32 * r] = mine[r];
            __syncwarp();
            // load_k's body spelled out: through the lambda ptxas spills 4 bytes here and this
            // kernel stops being main's SASS (the rows it runs would change speed).
            if (lane == 0) {
                for (int j = 0; j < u; ++j, ++kb) {
                    const int sk = kb % kStagesK;
                    const StageInfo e = sm.scratch.list[j];
                    mbar_wait(&sm.k_empty[sk], ((kb / kStagesK) & 1) ^ 1);
                    sm.info[sk] = e;
                    mbar_arrive_expect_tx(&sm.k_full[sk], kTileBytes);
                    for (int half = 0; half < 2; ++half)
                        tma_load_2d(sm.k[sk] + half * kHalfBytes, kmap, &sm.k_full[sk], g * kHeadDim + 64 * half, e.y);
                    atomicExch(&sm.loaded, kb + 1);
                    // V trails K by one block: the consumers need V of block n only after K of n + 1.
                    if (v_pending) load_v();
                    v_pending = true;
                    v_col = g * kHeadDim;
                    v_row = e.y;
                }
            }
        } else {
            int4 mine[kUnionMax / 32] = {};
#pragma unroll
            for (int r = 0; r < kUnionMax / 32; ++r)
                if (lane + 32 * r < u) mine[r] = entries[lane + 32 * r];
            for (int j = 0; j < u; ++j, ++kb) {
                const int r = j >> 5;
                const int4 m = r == 0 ? mine[0] : r == 1 ? mine[1] : r == 2 ? mine[2] : mine[3];
                const StageInfo e =
                    make_int4(__shfl_sync(0xffffffffu, m.x, j & 31), __shfl_sync(0xffffffffu, m.y, j & 31),
                              __shfl_sync(0xffffffffu, m.z, j & 31), __shfl_sync(0xffffffffu, m.w, j & 31));
                if (lane == 0) load_k(e);
                __syncwarp();
            }
        }
        __syncwarp();
    }
    if (lane == 0 && v_pending) load_v();
}

// Whether item's 8 queries all sit in their document's first block (its union is that block).
__device__ __forceinline__ bool first_block_tile(const Params& p, int item) {
    const int g = item / p.tiles, t7 = (item - g * p.tiles) * kQueriesPerCta + kQueriesPerCta - 1;
    if (t7 >= p.varlen.total_q) return false;
    const int b = p.varlen.query_fragment[t7];
    if (b != p.varlen.query_fragment[t7 - (kQueriesPerCta - 1)]) return false;
    const FragmentCoord f = fragment_coord(p.varlen, b);
    return f.position(t7 - f.q_start) < kBlock;
}
#endif  // MSA_SM90A_ENABLED

// The two-builder kernel's claim order (one CTA of kOrderThreads, in the counter memset's place;
// the forward is its programmatic dependent and waits for it only before its first counter claim):
// zeroes the counter and writes p.order for claims j < items - grid. Window claims (j <
// kOrderThreads) keep natural order but for the first kDeferWaves x grid first-block tiles, which
// take the last positions in natural order; claims past the window move up by their number.
// scripts/analysis/order_model.py checks that this is a permutation.
__global__ void __launch_bounds__(kOrderThreads) order_kernel(const Params p, int grid) {
#if MSA_SM90A_ENABLED
    // A programmatic dependent of whatever kernel precedes it: the forward, its own dependent,
    // reads the stream's earlier writes before its first griddepcontrol.wait, so the forward is
    // let go only once those writes are visible.
    griddep_wait();
    griddep_launch_dependents();
    __shared__ int warp_count[kOrderThreads / 32];
    const int n = kGroups * p.tiles - grid;
    const int j = static_cast<int>(threadIdx.x), lane = j & 31, warp = j >> 5;
    if (j == 0) *p.claim = 0;
    const bool cheap = j < n && first_block_tile(p, grid + j);
    const uint32_t ballot = __ballot_sync(0xffffffffu, cheap);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << lane) - 1u)), total = 0;  // cheap claims before j, in all
    for (int w = 0; w < kOrderThreads / 32; ++w) {
        const int c = warp_count[w];
        before += w < warp ? c : 0;
        total += c;
    }
    const int d = min(total, kDeferWaves * grid);
    if (j < n) p.order[cheap && before < d ? n - d + before : j - min(before, d)] = grid + j;
    for (int i = kOrderThreads + j; i < n; i += kOrderThreads) p.order[i - d] = grid + i;
#endif
}

template <int kBuilders>
__global__ void __launch_bounds__(kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                   const __grid_constant__ CUtensorMap vmap, const __grid_constant__ CUtensorMap omap, const Params p) {
#if MSA_SM90A_ENABLED
    // Swizzled tiles need 1024-byte alignment; dynamic shared memory starts aligned when the
    // kernel has no static shared memory, and a misaligned start would fail loudly here.
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if ((smem_u32(smem_raw) & 1023u) != 0) __trap();
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        tma_prefetch_map(&qmap);
        tma_prefetch_map(&kmap);
        tma_prefetch_map(&vmap);
        tma_prefetch_map(&omap);
        sm.loaded = 0;
        if constexpr (kBuilders == 2) {
            sm.ahead = sm.built = sm.next_slot = sm.finished = 0;
            sm.last_u = kUnionMax;  // nothing built yet: the second builder waits for a small union
        }
        for (int b = 0; b < kSlots; ++b) {
            mbar_init(&sm.slot_full[b], 32);
            mbar_init(&sm.slot_empty[b], 64);  // the K/V and the Q loader's lanes
        }
        for (int b = 0; b < 2; ++b) {
            mbar_init(&sm.q_full[b], 1);
            mbar_init(&sm.q_empty[b], kConsumerThreads);
        }
        for (int s = 0; s < kStagesK; ++s) {
            mbar_init(&sm.k_full[s], 1);
            mbar_init(&sm.k_empty[s], kConsumerThreads);
        }
        for (int s = 0; s < kStagesV; ++s) {
            mbar_init(&sm.v_full[s], 1);
            mbar_init(&sm.v_empty[s], kConsumerThreads);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp < 4) {
        regs_dealloc<40>();
        if (warp == 0) kv_loader<kBuilders>(sm, p, &kmap, &vmap);
        if constexpr (kBuilders == 1) {
            if (warp == 1) builder(sm, p);
        } else {
            if (warp == 1 || warp == 3) shared_builder(sm, p, warp == 3);
        }
        if (warp == 2) q_loader(sm, p, &qmap);
    } else {
        regs_alloc<232>();
        const OutPort op{&omap, sm.ostage[warp - 4]};
        consumer_stream(sm, p, warp / 4 - 1, op);
        if ((threadIdx.x & 31) == 0) bulk_wait_all();  // the last O stores have completed
    }
#endif
}

// The forward's scratch (msa_attn_forward_workspace_bytes): the claim counter, each item's union
// [4, tiles, 128] int4 (written by its builder, read back by its loader through L2), then the
// two-builder kernel's claim order [4 * tiles] int.
struct Workspace {
    size_t claim, entries, order, bytes;
};

inline Workspace workspace_layout(int total_q) {
    const size_t tiles = (static_cast<size_t>(total_q) + kQueriesPerCta - 1) / kQueriesPerCta;
    Workspace w;
    w.claim = 0;
    w.entries = 256;
    w.order = w.entries + kGroups * tiles * kUnionMax * sizeof(int4);
    w.bytes = w.order + kGroups * tiles * sizeof(int);
    return w;
}

// Persistent CTAs of the forward for `items` items on `sms` SMs.
inline int forward_grid(int items, int sms) { return items < sms ? items : sms; }

// Whether the layout runs the two-builder kernel (fragments of at most kShortDocBlocks KV blocks
// on average).
inline bool two_builders(const MsaVarlen& vl) { return vl.total_rows <= kShortDocBlocks * vl.batch; }

// Encodes the maps and launches `grid` persistent CTAs (p.claim zero; with two builders, as the
// programmatic dependent of order_kernel).
inline cudaError_t launch_forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const Params& p, int grid,
                                  cudaStream_t stream) {
    const MsaVarlen& vl = p.varlen;
    if (vl.total_q <= 0) return cudaSuccess;
    CUtensorMap qmap, kmap, vmap, omap;
    {
        // q and out [T, 64, 128]: boxes of (64 d, 16 heads, 8 tokens) and (64 d, 16 heads, 1).
        const uint64_t dims[3] = {kHeadDim, kHeads, static_cast<uint64_t>(vl.total_q)};
        const uint64_t strides[2] = {kHeadDim * 2, kHeads * kHeadDim * 2};
        const uint32_t box[3] = {64, kHeadsPerGroup, kQueriesPerCta};
        MSA_TRY(sm90::encode_bf16_sw128(&qmap, q, 3, dims, strides, box));
        const uint32_t obox[3] = {64, kHeadsPerGroup, 1};
        MSA_TRY(sm90::encode_bf16_sw128(&omap, p.out, 3, dims, strides, obox));
    }
    for (int which = 0; which < 2; ++which) {
        // k, v [Tk, 4 * 128] as rows: boxes of (64 d, 128 keys).
        const uint64_t dims[2] = {kGroups * kHeadDim, static_cast<uint64_t>(vl.total_k > 0 ? vl.total_k : 1)};
        const uint64_t strides[1] = {kGroups * kHeadDim * 2};
        const uint32_t box[2] = {64, kBlock};
        MSA_TRY(sm90::encode_bf16_sw128(which ? &vmap : &kmap, which ? v : k, 2, dims, strides, box));
    }
    if (two_builders(vl))
        return launch_smem_dependent(forward_kernel<2>, dim3(grid), dim3(kThreads), kSmemBytes, stream, qmap, kmap,
                                     vmap, omap, p);
    // A plain launch: after the counter's memset there is no kernel to overlap.
    return launch_smem(forward_kernel<1>, dim3(grid), dim3(kThreads), kSmemBytes, stream, qmap, kmap, vmap, omap, p);
}

// The whole sm_90a forward of msa_attn_forward: the claim counter zeroed (with two builders by
// order_kernel, which also writes the claim order and which the kernel overlaps), then the
// kernel, which builds every tile's union itself (union and run-order kernels in front of it were
// 14% of a short-document rank's forward, docs/perf/attention-forward-sm90.md).
inline cudaError_t run(const MsaAttnFwdParams& a, cudaStream_t stream) {
    const MsaVarlen& vl = a.varlen;
    const Workspace w = workspace_layout(vl.total_q);
    if (a.workspace == nullptr || a.workspace_bytes < w.bytes || !aligned16(a.workspace)) return cudaErrorInvalidValue;
    uint8_t* base = static_cast<uint8_t*>(a.workspace);
    Params p;
    p.topk = a.topk;
    p.entries = reinterpret_cast<int4*>(base + w.entries);
    p.claim = reinterpret_cast<int*>(base + w.claim);
    p.varlen = vl;
    p.out = a.out;
    p.lse = a.lse;
    p.tiles = (vl.total_q + kQueriesPerCta - 1) / kQueriesPerCta;
    p.order = reinterpret_cast<int*>(base + w.order);
    int sms = 0;
    MSA_TRY(current_device_sms(&sms));
    const int grid = forward_grid(kGroups * p.tiles, sms);  // order_kernel's order is for this grid
    if (vl.total_q > 0 && two_builders(vl))
        MSA_TRY(launch_smem_dependent(order_kernel, dim3(1), dim3(kOrderThreads), 0, stream, p, grid));
    else
        MSA_TRY(cudaMemsetAsync(p.claim, 0, sizeof(int), stream));
    return launch_forward(a.q, a.k, a.v, p, grid, stream);
}

}  // namespace msa::fwd90
