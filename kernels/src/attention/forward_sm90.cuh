// Sparse attention forward for Hopper (sm_90a): the "F1" shared-selection kernel of
// docs/perf/attention-forward-sm90.md. A work item is (KV group g, tile of 8 consecutive packed
// queries), 128 rows = 8 queries x the group's 16 heads; it runs one online softmax over the
// tile's block union (tile_union.cuh), so every K/V block is loaded once per tile and each
// 128 x 128 block product is one pair of wgmma chains.
//
// Warp specialization (FlashAttention-3's structure): 384 threads, warpgroup 0 is the producer
// (one thread issues TMA loads of Q and of K and V per block into a 2-stage ring), warpgroups 1
// and 2 are consumers owning rows 0-63 (queries 0-3) and 64-127 (queries 4-7). In the m64
// accumulator layout warp w of a consumer holds rows 16w..16w+15: one query's 16 heads, so the
// causal and selection masks are warp-uniform (a query that did not choose a union block gets
// P = 0 for it). S = QK^T is an SS wgmma chain; O += PV takes P from registers (RS).
// kStream (the production schedule) issues S of block j+1 together with PV of block j, across
// tile boundaries too, and runs the softmax of j+1 while PV is in flight; the two consumers take
// turns issuing (pingpong, named barriers 1 and 2) so one warpgroup's softmax hides behind the
// other's matrix products. !kStream is the serial schedule, kept as the baseline it is measured
// against.
//
// Persistent: gridDim.x CTAs stride over the items in the longest-first run order of
// tile_order_kernel (the most-loaded CTA was 1.01-1.10x the mean in natural order on the
// development ranks); items whose union exceeds `union_max` are left to the v1 kernel.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "msa/attention.h"
#include "msa/common.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/dependent_launch.cuh"
#include "common/launch.cuh"
#include "common/varlen.cuh"
#include "common/sm90/arch.cuh"
#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/wgmma.cuh"
#include "attention/tile_union.cuh"


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

// One union block as tile_union_kernel lists it: (physical block, packed K row of key 0, stored
// keys, mask of the tile queries that chose it).
using StageInfo = int4;

struct Smem {
    uint8_t q[2][kTileBytes];
    uint8_t k[kStagesK][kTileBytes];
    uint8_t v[kStagesV][kTileBytes];
    uint8_t ostage[8][kOutStageBytes];  // per consumer warp: its query's O for the TMA store
    StageInfo info[kStagesK];
    StageInfo list[kUnionMax];  // the producer's copy of the current tile's union
    uint64_t q_full[2], q_empty[2];
    uint64_t k_full[kStagesK], k_empty[kStagesK], v_full[kStagesV], v_empty[kStagesV];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem));
static_assert(kSmemBytes <= kMaxSmemSm90, "the forward's shared memory fits a block");

struct Params {
    const int2* run;        // [4 * tiles]: (item, union size) in run order (tile_order_kernel)
    const int4* entries;    // [4, tiles, 128]
    const int32_t* wpos;    // [T]
    MsaVarlen varlen;
    uint16_t* out;
    float* lse;
    int tiles;
    int union_max;
};

#if MSA_SM90A_ENABLED
using namespace msa::sm90;

__device__ __forceinline__ bool takes(int u, int union_max) { return u <= union_max; }

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
    __device__ __forceinline__ bool step(float (&s)[64], int n_visible, float (&corr)[2]) {
        const int c = 2 * (threadIdx.x & 3);
        if (n_visible < kBlock) {
#pragma unroll
            for (int i = 0; i < 16; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (8 * i + c + e >= n_visible) s[4 * i + e] = s[4 * i + 2 + e] = -INFINITY;
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
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
        for (int i = 0; i < 16; ++i) {
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

__device__ __forceinline__ void to_a_frags(const float (&p)[64], uint32_t (&a)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
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

// The CTA's items in run order (list positions blockIdx.x + k * gridDim.x), with the next item
// and its union size loaded a whole item ahead, so no tile starts on a global-memory round trip.
struct ItemCursor {
    int pos, item, u;
    int2 next;

    __device__ __forceinline__ ItemCursor(const Params& p) : pos(blockIdx.x) {
        const int items = kGroups * p.tiles;
        const int2 here = pos < items ? p.run[pos] : make_int2(0, 0);
        item = here.x;
        u = here.y;
        next = pos + static_cast<int>(gridDim.x) < items ? p.run[pos + gridDim.x] : make_int2(0, 0);
    }
    __device__ __forceinline__ bool valid(const Params& p) const { return pos < kGroups * p.tiles; }
    __device__ __forceinline__ void advance(const Params& p) {
        pos += gridDim.x;
        item = next.x;
        u = next.y;
        const int after = pos + static_cast<int>(gridDim.x);
        next = after < kGroups * p.tiles ? p.run[after] : make_int2(0, 0);
    }
};

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
    const int c = 2 * (lane & 3);
    const int h0 = g * kHeadsPerGroup + (lane >> 2);
    if (lane == 0) bulk_wait_read_all();  // this warp's previous store has read the buffer
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int h = h0 + 8 * r, row = (lane >> 2) + 8 * r;
        const bool any = l[r] > 0.f;
        const float inv = any ? 1.f / l[r] : 0.f;
        // Columns 8i + c, c + 1: 16-byte chunk i of the row, XORed with row % 8 inside its half.
#pragma unroll
        for (int i = 0; i < 16; ++i)
            *reinterpret_cast<uint32_t*>(op.stage + (i >> 3) * (kOutStageBytes / 2) + row * 128 +
                                         (((i & 7) ^ (row & 7)) << 4) + c * 2) =
                pack_bf16(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
        if (c == 0) p.lse[static_cast<int64_t>(t) * kHeads + h] = any ? m[r] * kScale + logf(l[r]) : -INFINITY;
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
        if (nv > 0) {
            to_a_frags(s, pa);
        } else {
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
        }
    }
};

__device__ __forceinline__ void zero(float (&o)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
}

// Per item: S, softmax and PV of each block in turn, nothing in flight across blocks or tiles.
// The reference schedule for the streaming consumer below.
__device__ __forceinline__ void consumer_serial(Smem& sm, const Params& p, int wg, const OutPort& op) {
    const int token = 4 * wg + ((threadIdx.x >> 5) & 3);
    int tile_it = 0, kb = 0;
    ConsumerState cs{sm};
    float o[64];
    for (ItemCursor it(p); it.valid(p); it.advance(p)) {
        const int u = it.u;
        if (!takes(u, p.union_max)) continue;
        TileQuery q;
        q.g = it.item / p.tiles;
        q.t = (it.item - q.g * p.tiles) * kQueriesPerCta + token;
        q.wpos = q.t < p.varlen.total_q ? p.wpos[q.t] : -1;
        const int qb = tile_it & 1;
        mbar_wait(&sm.q_full[qb], (tile_it >> 1) & 1);
        cs.q_addr = smem_u32(sm.q[qb]) + wg * kWgRowBytes;
        cs.rs.init();
        zero(o);
        for (int j = 0; j < u; ++j, ++kb) {
            const int sk = kb % kStagesK, sv = kb % kStagesV;
            const int nv = cs.qk(sk, (kb / kStagesK) & 1, q, token);
            wgmma_wait<0>();
            fence_regs(cs.s);
            mbar_release(&sm.k_empty[sk]);
            float corr[2];
            const bool need = cs.softmax(nv, corr);
            cs.to_p(nv);
            rescale(o, corr, need);
            mbar_wait(&sm.v_full[sv], (kb / kStagesV) & 1);
            wgmma_fence();
            issue_pv(o, cs.pa, smem_u32(sm.v[sv]));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(o);
            mbar_release(&sm.v_empty[sv]);
        }
        mbar_release(&sm.q_empty[qb]);
        epilogue(o, cs.rs.m, cs.rs.l, q.t, q.g, q.valid(), p, op);
        ++tile_it;
    }
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
    ItemCursor it(p);
    int qb = 0, u = 0;
    TileQuery q{};
    // This warp's query of `item`; its position is loaded one item ahead (pf_*).
    int pf_item = -1, pf_wpos = -1;
    auto wpos_at = [&](int item) {
        const int t = (item % p.tiles) * kQueriesPerCta + token;
        return t < p.varlen.total_q ? p.wpos[t] : -1;
    };
    auto query_of = [&](int item) {
        TileQuery r;
        r.g = item / p.tiles;
        r.t = (item - r.g * p.tiles) * kQueriesPerCta + token;
        r.wpos = item == pf_item ? pf_wpos : wpos_at(item);
        return r;
    };
    // Moves to the next tile with blocks (the cursor's current item first), answering the
    // tiles without blocks on the way; false when the CTA has no more tiles.
    auto next_tile = [&]() -> bool {
        for (; it.valid(p); it.advance(p)) {
            if (!takes(it.u, p.union_max)) continue;
            q = query_of(it.item);
            qb = tile_it & 1;
            mbar_wait(&sm.q_full[qb], (tile_it >> 1) & 1);
            ++tile_it;
            if (it.u > 0) {
                u = it.u;
                cs.q_addr = smem_u32(sm.q[qb]) + wg * kWgRowBytes;
                it.advance(p);
                if (it.valid(p)) {
                    pf_item = it.item;
                    pf_wpos = wpos_at(it.item);
                }
                return true;
            }
            mbar_release(&sm.q_empty[qb]);
            epilogue_empty(q, p, op);
        }
        return false;
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

// Warp 0 of the producer warpgroup: the warp copies each tile's union into shared memory, lane 0
// issues the TMA loads (Q once per tile, then K and V of every union block).
__device__ __forceinline__ void producer(Smem& sm, const Params& p, const CUtensorMap* qmap, const CUtensorMap* kmap,
                                         const CUtensorMap* vmap) {
    const int lane = threadIdx.x & 31;
    int tile_it = 0, kb = 0, vb = 0;
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
    for (ItemCursor it(p); it.valid(p); it.advance(p)) {
        const int u = it.u;
        if (!takes(u, p.union_max)) continue;
        const int g = it.item / p.tiles, tile = it.item - g * p.tiles;
        // The union's loads go out first; Q is issued while they are in flight.
        const int4* entries = p.entries + static_cast<int64_t>(it.item) * kUnionMax;
        int4 mine[kUnionMax / 32];
#pragma unroll
        for (int r = 0; r < kUnionMax / 32; ++r)
            if (lane + 32 * r < u) mine[r] = entries[lane + 32 * r];
        const int qb = tile_it & 1;
        if (lane == 0) {
            mbar_wait(&sm.q_empty[qb], ((tile_it >> 1) & 1) ^ 1);
            mbar_arrive_expect_tx(&sm.q_full[qb], kTileBytes);
            for (int half = 0; half < 2; ++half)
                tma_load_3d(sm.q[qb] + half * kHalfBytes, qmap, &sm.q_full[qb], 64 * half, g * kHeadsPerGroup,
                            tile * kQueriesPerCta);
        }
#pragma unroll
        for (int r = 0; r < kUnionMax / 32; ++r)
            if (lane + 32 * r < u) sm.list[lane + 32 * r] = mine[r];
        __syncwarp();
        if (lane == 0) {
            for (int j = 0; j < u; ++j, ++kb) {
                const int sk = kb % kStagesK;
                const StageInfo e = sm.list[j];
                mbar_wait(&sm.k_empty[sk], ((kb / kStagesK) & 1) ^ 1);
                sm.info[sk] = e;
                mbar_arrive_expect_tx(&sm.k_full[sk], kTileBytes);
                for (int half = 0; half < 2; ++half)
                    tma_load_2d(sm.k[sk] + half * kHalfBytes, kmap, &sm.k_full[sk], g * kHeadDim + 64 * half, e.y);
                // V trails K by one block: the consumers need V of block n only after K of n + 1.
                if (v_pending) load_v();
                v_pending = true;
                v_col = g * kHeadDim;
                v_row = e.y;
            }
        }
        __syncwarp();
        ++tile_it;
    }
    if (lane == 0 && v_pending) load_v();
}
#endif  // MSA_SM90A_ENABLED

// The consumers' schedules, in the order they were built (docs/perf/attention-forward-sm90.md).
enum class Schedule { kSerial, kStream };

template <Schedule kSchedule>
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
    grid_dependency_wait();  // tile_order_kernel's run list (the prologue above overlapped it)
    if (warp < 4) {
        regs_dealloc<40>();
        if (warp == 0) producer(sm, p, &qmap, &kmap, &vmap);
    } else {
        regs_alloc<232>();
        const OutPort op{&omap, sm.ostage[warp - 4]};
        if constexpr (kSchedule == Schedule::kStream) {
            consumer_stream(sm, p, warp / 4 - 1, op);
        } else {
            consumer_serial(sm, p, warp / 4 - 1, op);
        }
        if ((threadIdx.x & 31) == 0) bulk_wait_all();  // the last O stores have completed
    }
#endif
}

// The forward's scratch (msa_attn_forward_workspace_bytes): tile-union counts [4, tiles] i32,
// entries [4, tiles, 128] int4, query positions [T] i32 and the run order [4 * tiles] int2, each
// part 256-byte aligned.
struct Workspace {
    size_t counts, entries, wpos, run, bytes;
};

inline Workspace workspace_layout(int total_q) {
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    const size_t tiles = (static_cast<size_t>(total_q) + kQueriesPerCta - 1) / kQueriesPerCta;
    Workspace w;
    w.counts = 0;
    w.entries = align(kGroups * tiles * sizeof(int32_t));
    w.wpos = w.entries + align(kGroups * tiles * kUnionMax * sizeof(int4));
    w.run = w.wpos + align(static_cast<size_t>(total_q) * sizeof(int32_t));
    w.bytes = w.run + align(kGroups * tiles * sizeof(int2));
    return w;
}

// Persistent CTAs of the forward for `items` items on `sms` SMs; the run order is made for it.
inline int forward_grid(int items, int sms) { return items < sms ? items : sms; }

// Encodes the maps and launches forward_grid persistent CTAs. counts/entries/wpos come from
// tile_union_kernel over the same topk and varlen, run from tile_order_kernel for this grid.
template <Schedule kSchedule>
inline cudaError_t launch_forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const Params& p, int sms,
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
    const int items = kGroups * p.tiles;
    return launch_dependent(forward_kernel<kSchedule>, dim3(forward_grid(items, sms)), dim3(kThreads), kSmemBytes,
                            stream, qmap, kmap, vmap, omap, p);
}

// The whole sm_90a forward of msa_attn_forward: tile unions, then the streaming kernel over
// every tile (union_max = 128: measured faster than v1 on every selection pattern, random
// included: docs/perf/attention-forward-sm90.md).
inline cudaError_t run(const MsaAttnFwdParams& a, cudaStream_t stream) {
    const MsaVarlen& vl = a.varlen;
    const Workspace w = workspace_layout(vl.total_q);
    if (a.workspace == nullptr || a.workspace_bytes < w.bytes || !aligned16(a.workspace)) return cudaErrorInvalidValue;
    uint8_t* base = static_cast<uint8_t*>(a.workspace);
    Params p;
    int32_t* counts = reinterpret_cast<int32_t*>(base + w.counts);
    p.entries = reinterpret_cast<int4*>(base + w.entries);
    p.wpos = reinterpret_cast<int32_t*>(base + w.wpos);
    p.run = reinterpret_cast<int2*>(base + w.run);
    p.varlen = vl;
    p.out = a.out;
    p.lse = a.lse;
    p.tiles = (vl.total_q + kQueriesPerCta - 1) / kQueriesPerCta;
    p.union_max = kUnionMax;
    int sms = 0;
    MSA_TRY(current_device_sms(&sms));
    MSA_TRY(launch(tile_union_kernel, dim3(p.tiles, kGroups), dim3(kTileUnionThreads), stream, a.topk, vl,
                   counts, const_cast<int4*>(p.entries), const_cast<int32_t*>(p.wpos)));
    const int items = kGroups * p.tiles;
    MSA_TRY(launch_dependent(tile_order_kernel, dim3(1), dim3(kTileOrderThreads), 0, stream,
                             static_cast<const int32_t*>(counts), items, forward_grid(items, sms),
                             const_cast<int2*>(p.run)));
    return launch_forward<Schedule::kStream>(a.q, a.k, a.v, p, sms, stream);
}

}  // namespace msa::fwd90
