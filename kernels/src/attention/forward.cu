// Sparse attention forward (docs/contract.md §2.4) and its dispatch: on compute capability 9.0 the
// sm_90a kernel of attention/forward_sm90.cuh; elsewhere this query-outer mma.sync kernel: one
// CTA per (8 queries, KV group), one warp per query, a single-pass fp32 online softmax over the
// query's selected blocks. Each K/V block of the CTA's union is loaded once; masking is only
// needed where the query sees fewer than 128 keys of the block (its local block, or a short last
// block of the document).
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/softmax.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "common/sm80/mma.cuh"
#include "common/sm80/tile.cuh"
#include "attention/block_union.cuh"
#include "attention/epilogue_fwd.cuh"
#include "attention/forward_sm90.cuh"
#include "attention/mainloop_q_outer_sm80.cuh"

namespace msa {
namespace {

constexpr int kNT = kBlock / 8;    // key n-tiles of S
constexpr int kDT = kHeadDim / 8;  // d n-tiles of O

// S = Q K^T over the block's 128 keys, online softmax, O += bf16(P) V.
__device__ __forceinline__ void fwd_block(const uint32_t (&qa)[kHeadDim / 16][4], uint32_t k_tile, uint32_t v_tile,
                                          int n_visible, OnlineSoftmax& sm, float (&o)[kDT][4]) {
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks)
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
            uint32_t b[4];
            ldsm_b_nk(k_tile, 16 * np, 16 * ks, b);
            mma_bf16(s[2 * np], qa[ks], b[0], b[1]);
            mma_bf16(s[2 * np + 1], qa[ks], b[2], b[3]);
        }
    if (n_visible < kBlock) mask_keys(s, 0, n_visible);
    sm.update(s, o);
#pragma unroll
    for (int j = 0; j < kBlock / 16; ++j) {
        uint32_t pa[4];
        acc_to_a(s, j, pa);
#pragma unroll
        for (int np = 0; np < kDT / 2; ++np) {
            uint32_t b[4];
            ldsm_b_kn(v_tile, 16 * j, 16 * np, b);
            mma_bf16(o[2 * np], pa, b[0], b[1]);
            mma_bf16(o[2 * np + 1], pa, b[2], b[3]);
        }
    }
}

__global__ void __launch_bounds__(kQOuterThreads, 1)
    attn_forward_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                        const uint16_t* __restrict__ v, const int32_t* __restrict__ topk, const MsaVarlen varlen,
                        uint16_t* __restrict__ out, float* __restrict__ lse) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    QOuterSmem& s = *reinterpret_cast<QOuterSmem*>(smem_raw);
    const int g = blockIdx.y;
    const int t0 = blockIdx.x * kQueriesPerCta;
    const int t = t0 + (threadIdx.x >> 5);
    // Warps past total_q compute nothing (no selections) but still join every barrier.
    const bool active = t < varlen.total_q;
    const int64_t head_row = static_cast<int64_t>(active ? t : 0) * kHeads + g * kHeadsPerGroup;

    uint32_t qa[kHeadDim / 16][4];
    int wpos = 0;
    if (active) {
        load_head_frags(q + head_row * kHeadDim, qa);
        const QueryCoord c = query_coord(varlen, t);
        wpos = c.phys_base * kBlock + c.pos;
    }

    const int n_blocks = build_block_union<kQOuterThreads>(s.u, topk, varlen, g, t0);

    OnlineSoftmax sm;
    sm.init();
    float o[kDT][4];
#pragma unroll
    for (int nt = 0; nt < kDT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

    q_outer_mainloop(s, n_blocks, k, v, g, wpos,
                     [&](uint32_t k_tile, uint32_t v_tile, int n_visible) {
                         fwd_block(qa, k_tile, v_tile, n_visible, sm, o);
                     });

    if (active) fwd_epilogue(o, sm, out + head_row * kHeadDim, lse + head_row);
}

cudaError_t forward_sm80(const MsaAttnFwdParams& p, cudaStream_t stream) {
    const dim3 grid((p.varlen.total_q + kQueriesPerCta - 1) / kQueriesPerCta, kGroups);
    return launch_smem(attn_forward_kernel, grid, kQOuterThreads, sizeof(QOuterSmem), stream, p.q, p.k, p.v, p.topk,
                       p.varlen, p.out, p.lse);
}

}  // namespace
}  // namespace msa

extern "C" int msa_attn_forward_workspace_bytes(MsaVarlen varlen, size_t* bytes) {
    if (bytes == nullptr || varlen.total_q < 0) return cudaErrorInvalidValue;
    *bytes = msa::fwd90::workspace_layout(varlen.total_q).bytes;
    return cudaSuccess;
}

extern "C" int msa_attn_forward(const MsaAttnFwdParams* params, void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    if (params->varlen.total_q <= 0) return cudaSuccess;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (params->force_sm80) return msa::forward_sm80(*params, s);
    return msa::dispatch_arch([&] { return msa::forward_sm80(*params, s); },
                              [&] { return msa::fwd90::run(*params, s); });
}
