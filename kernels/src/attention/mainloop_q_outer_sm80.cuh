// Mainloop of the query-outer kernels on the sm_80 path (mma.sync, cp.async; forward and
// deterministic dQ, so named by loop order rather than direction): streams the K and V tiles of
// the CTA's block union through a two-stage cp.async pipeline and hands each block to the warps
// that selected it. The per-block math is the caller's (forward: online softmax and P V;
// dQ: P, dP, dS and dS K).
#pragma once

#include <cstdint>

#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "common/sm80/tile.cuh"
#include "attention/block_union.cuh"

namespace msa {

constexpr int kQOuterThreads = 32 * kQueriesPerCta;
constexpr int kKvTileBytes = kBlock * kTileRowBytes;  // 32 KB: 128 keys x 128 d bf16

struct QOuterSmem {
    alignas(128) uint8_t kv[2][2][kKvTileBytes];  // [stage][0 = K, 1 = V]: 128 KB
    BlockUnion u;
};

// A fragments (16 heads x 128 d, 8 k-steps) of one query straight from global memory: rows are
// the 16 contiguous heads of group g of token t. Loaded once per warp, so no smem staging.
__device__ __forceinline__ void load_head_frags(const uint16_t* __restrict__ rows, uint32_t (&a)[8][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
    const uint32_t* lo = reinterpret_cast<const uint32_t*>(rows + g * kHeadDim + c);
    const uint32_t* hi = reinterpret_cast<const uint32_t*>(rows + (g + 8) * kHeadDim + c);
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        a[ks][0] = __ldg(lo + 8 * ks);
        a[ks][1] = __ldg(hi + 8 * ks);
        a[ks][2] = __ldg(lo + 8 * ks + 4);
        a[ks][3] = __ldg(hi + 8 * ks + 4);
    }
}

// block_math(k_tile, v_tile, n_visible) runs on every warp whose query selected the block, with
// the shared addresses of the block's swizzled K and V tiles and the number of leading keys its
// query sees (rows past the stored keys are zero-filled, so masked P times V stays finite).
// Every thread calls this (barriers); wpos is the warp's query in workspace coordinates.
template <class BlockMath>
__device__ __forceinline__ void q_outer_mainloop(QOuterSmem& s, int n_blocks, const uint16_t* __restrict__ k,
                                                 const uint16_t* __restrict__ v, int g, int wpos,
                                                 BlockMath&& block_math) {
    const int tid = threadIdx.x, warp = tid >> 5;
    auto load = [&](int u) {
        const int start = s.u.start[u], count = s.u.count[u];
        auto rows_of = [&](const uint16_t* base) {
            return [=](int r) -> const uint16_t* {
                return r < count ? base + (static_cast<int64_t>(start + r) * kGroups + g) * kHeadDim : nullptr;
            };
        };
        tile_load_async<kBlock, kQOuterThreads>(smem_addr(s.kv[u & 1][0]), rows_of(k), k, tid);
        tile_load_async<kBlock, kQOuterThreads>(smem_addr(s.kv[u & 1][1]), rows_of(v), v, tid);
    };

    if (n_blocks > 0) load(0);
    cp_async_commit();
    for (int u = 0; u < n_blocks; ++u) {
        // Block u + 1 streams in while block u is computed; the group count stays uniform (an
        // empty group at the end) so wait_group<1> always means "block u has landed".
        if (u + 1 < n_blocks) load(u + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if ((s.u.warps[u] >> warp) & 1u)
            block_math(smem_addr(s.kv[u & 1][0]), smem_addr(s.kv[u & 1][1]),
                       visible_keys(wpos, s.u.pb[u], s.u.count[u]));
        // Stage u & 1 is refilled by the next iteration's load.
        __syncthreads();
    }
}

}  // namespace msa
