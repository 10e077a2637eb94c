// Deterministic dQ, query-outer: the forward's structure (one warp per query, the CTA streams the
// union of its 8 queries' blocks in ascending order) recomputing P from the saved LSE.
// dQ = sum over selected visible keys of dS k with dS = bf16(P (dP - delta) scale) and
// dP = dout v, accumulated in fp32 registers in a fixed order: no atomics, bitwise repeatable.
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "common/softmax.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "common/sm80/mma.cuh"
#include "common/sm80/tile.cuh"
#include "attention/block_union.cuh"
#include "attention/mainloop_q_outer_sm80.cuh"

namespace msa {
namespace {

constexpr int kDT = kHeadDim / 8;  // d n-tiles of dQ
// Keys per pass over a block: S and dP of 32 keys (2 x 16 registers) next to the resident Q, dO
// (2 x 32) and dQ (64) fragments keep the warp under the 255-register cap without spills.
constexpr int kChunk = 32;
constexpr int kCT = kChunk / 8;

struct RowStats {
    float lse2[2];   // LSE * log2(e) of rows g and g + 8 (+inf for an empty selection)
    float delta[2];  // rowsum(dout * out) of the same rows
};

__device__ __forceinline__ void dq_block(const uint32_t (&qa)[kHeadDim / 16][4], const uint32_t (&da)[kHeadDim / 16][4],
                                         const RowStats& rs, uint32_t k_tile, uint32_t v_tile, int n_visible,
                                         float (&dq)[kDT][4]) {
    const int t = threadIdx.x & 3;
#pragma unroll 1
    for (int key0 = 0; key0 < kBlock; key0 += kChunk) {
        float s[kCT][4], dp[kCT][4];
#pragma unroll
        for (int nt = 0; nt < kCT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks)
#pragma unroll
            for (int np = 0; np < kCT / 2; ++np) {
                uint32_t b[4];
                ldsm_b_nk(k_tile, key0 + 16 * np, 16 * ks, b);
                mma_bf16(s[2 * np], qa[ks], b[0], b[1]);
                mma_bf16(s[2 * np + 1], qa[ks], b[2], b[3]);
                ldsm_b_nk(v_tile, key0 + 16 * np, 16 * ks, b);
                mma_bf16(dp[2 * np], da[ks], b[0], b[1]);
                mma_bf16(dp[2 * np + 1], da[ks], b[2], b[3]);
            }
        // dS in place of s. Masked keys get P = 0 by selection, not by arithmetic on -inf.
#pragma unroll
        for (int nt = 0; nt < kCT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1;
                const bool visible = key0 + 8 * nt + 2 * t + (e & 1) < n_visible;
                const float p = visible ? ex2(fmaf(s[nt][e], kScaleLog2e, -rs.lse2[r])) : 0.f;
                s[nt][e] = p * (dp[nt][e] - rs.delta[r]) * kScale;
            }
#pragma unroll
        for (int j = 0; j < kCT / 2; ++j) {
            uint32_t dsa[4];
            acc_to_a(s, j, dsa);
#pragma unroll
            for (int np = 0; np < kDT / 2; ++np) {
                uint32_t b[4];
                ldsm_b_kn(k_tile, key0 + 16 * j, 16 * np, b);
                mma_bf16(dq[2 * np], dsa, b[0], b[1]);
                mma_bf16(dq[2 * np + 1], dsa, b[2], b[3]);
            }
        }
    }
}

__global__ void __launch_bounds__(kQOuterThreads, 1)
    attn_backward_dq_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                            const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            const int32_t* __restrict__ topk, const MsaVarlen varlen, uint16_t* __restrict__ dq_out) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    QOuterSmem& s = *reinterpret_cast<QOuterSmem*>(smem_raw);
    const int g = blockIdx.y;
    const int t0 = blockIdx.x * kQueriesPerCta;
    const int t = t0 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    // Warps past total_q compute nothing (no selections) but still join every barrier.
    const bool active = t < varlen.total_q;
    const int64_t head_row = static_cast<int64_t>(active ? t : 0) * kHeads + g * kHeadsPerGroup;

    uint32_t qa[kHeadDim / 16][4], da[kHeadDim / 16][4];
    RowStats rs;
    int wpos = 0;
    if (active) {
        load_head_frags(q + head_row * kHeadDim, qa);
        load_head_frags(dout + head_row * kHeadDim, da);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            rs.lse2[r] = lse_to_log2(lse[head_row + (lane >> 2) + 8 * r]);
            rs.delta[r] = delta[head_row + (lane >> 2) + 8 * r];
        }
        const QueryCoord c = query_coord(varlen, t);
        wpos = c.phys_base * kBlock + c.pos;
    }

    const int n_blocks = build_block_union<kQOuterThreads>(s.u, topk, varlen, g, t0);

    float dq[kDT][4];
#pragma unroll
    for (int nt = 0; nt < kDT; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.f;

    q_outer_mainloop(s, n_blocks, k, v, g, wpos, [&](uint32_t k_tile, uint32_t v_tile, int n_visible) {
        dq_block(qa, da, rs, k_tile, v_tile, n_visible, dq);
    });

    if (active) {
        // The scale is already inside dS: dq is final. Queries without a selection write zeros.
        uint16_t* rows = dq_out + head_row * kHeadDim;
        const int gr = lane >> 2, col0 = 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < kDT; ++nt) {
            *reinterpret_cast<uint32_t*>(rows + gr * kHeadDim + 8 * nt + col0) = pack_bf16(dq[nt][0], dq[nt][1]);
            *reinterpret_cast<uint32_t*>(rows + (gr + 8) * kHeadDim + 8 * nt + col0) = pack_bf16(dq[nt][2], dq[nt][3]);
        }
    }
}

cudaError_t backward_dq_sm80(const MsaAttnBwdParams& p, cudaStream_t stream) {
    const dim3 grid((p.varlen.total_q + kQueriesPerCta - 1) / kQueriesPerCta, kGroups);
    return launch_smem(attn_backward_dq_kernel, grid, kQOuterThreads, sizeof(QOuterSmem), stream, p.q, p.k, p.v,
                       p.dout, p.lse, p.delta, p.topk, p.varlen, p.dq);
}

}  // namespace
}  // namespace msa

extern "C" int msa_attn_backward_dq(const MsaAttnBwdParams* params, void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    if (params->varlen.total_q <= 0) return cudaSuccess;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return msa::dispatch_arch([&] { return msa::backward_dq_sm80(*params, s); });
}
