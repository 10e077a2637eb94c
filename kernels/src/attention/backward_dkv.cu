// Deterministic dK/dV, physical-block-outer: one CTA per (physical block, group) owns the block's
// gradient. It walks the block's row of the physical CSR (every query of every fragment of the
// document that selected the block, ascending) in half tiles of 4 queries with the KV-outer tile
// math shared with the atomic main kernel (phases 1 and 2), keeps dK/dV in fp32 registers and
// writes them once in bf16. The order of accumulation is fixed, so results are bitwise repeatable.
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "attention/mainloop_kv_outer_sm80.cuh"

namespace msa {
namespace {

__global__ void __launch_bounds__(kKvOuterThreads, 1)
    attn_backward_dkv_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                             const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             const int32_t* __restrict__ phys_row_ptr, const int32_t* __restrict__ phys_q_indices,
                             const int32_t* __restrict__ phys_valid, const MsaVarlen varlen, uint16_t* __restrict__ dk_out,
                             uint16_t* __restrict__ dv_out) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    KvOuterSmem& s = *reinterpret_cast<KvOuterSmem*>(smem_raw);
    const int pb = blockIdx.x, g = blockIdx.y;
    const BlockKeys bk = block_keys(varlen, pb);
    if (bk.count == 0) return;  // padding block: no packed rows to write (CTA-uniform)

    const int32_t* row_ptr = phys_row_ptr + static_cast<int64_t>(g) * (varlen.padded_kv_blocks + 1);
    const int64_t edges = static_cast<int64_t>(g) * varlen.total_q * kTopK;
    const int lo = row_ptr[pb], hi = row_ptr[pb + 1];
    const int n_half_tiles = hi > lo ? (hi - lo + kSlotsPerHalf - 1) / kSlotsPerHalf : 0;

    // Slot i of half tile j is CSR entry lo + 4 j + i; the low bits of its phys_valid are the keys
    // of this block the query sees.
    auto slot_of = [&](int j) {
        return [=](int i) -> SlotInfo {
            const int e = lo + kSlotsPerHalf * j + i;
            if (e >= hi) return invalid_slot();
            const int qrow = phys_q_indices[edges + e];
            if (qrow < 0 || qrow >= varlen.total_q) return invalid_slot();
            return SlotInfo{qrow, min(phys_valid[edges + e] & kPhysVisibleMask, bk.count)};
        };
    };

    float dk[kAccTiles][4], dv[kAccTiles][4];
    zero_acc(dk);
    zero_acc(dv);
    if (n_half_tiles > 0) {
        kv_outer_load_block(s, k, v, g, bk);
        kv_outer_load_half(s, 0, q, dout, lse, delta, g, slot_of(0));
        cp_async_commit();
    }
    for (int j = 0; j < n_half_tiles; ++j) {
        const int buf = j & 1;
        cp_async_wait<0>();
        __syncthreads();  // K/V (first tile), Q/dO and row scalars have landed
        kv_outer_scores(s, buf);
        __syncthreads();  // P, dS complete
        kv_outer_dkv(s, buf, dk, dv);
        __syncthreads();  // Q, dO, P, dS are free: the next tile's phase 1 follows the next barrier
        if (j + 1 < n_half_tiles) {
            kv_outer_load_half(s, buf ^ 1, q, dout, lse, delta, g, slot_of(j + 1));
            cp_async_commit();
        }
    }

    // Warp w holds keys 16 w + g and 16 w + g + 8; a block nobody selected writes zeros.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = 16 * warp + (lane >> 2) + 8 * r;
        if (key >= bk.count) continue;
        const int64_t off = (static_cast<int64_t>(bk.start) + key) * kKRowElems + g * kHeadDim + 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < kAccTiles; ++nt) {
            *reinterpret_cast<uint32_t*>(dk_out + off + 8 * nt) = pack_bf16(dk[nt][2 * r], dk[nt][2 * r + 1]);
            *reinterpret_cast<uint32_t*>(dv_out + off + 8 * nt) = pack_bf16(dv[nt][2 * r], dv[nt][2 * r + 1]);
        }
    }
}

cudaError_t backward_dkv_sm80(const MsaAttnBwdParams& p, cudaStream_t stream) {
    const dim3 grid(p.varlen.padded_kv_blocks, kGroups);
    return launch_smem(attn_backward_dkv_kernel, grid, kKvOuterThreads, sizeof(KvOuterSmem), stream, p.q, p.k, p.v,
                       p.dout, p.lse, p.delta, p.phys_row_ptr, p.phys_q_indices, p.phys_valid, p.varlen, p.dk, p.dv);
}

}  // namespace
}  // namespace msa

extern "C" int msa_attn_backward_dkv(const MsaAttnBwdParams* params, void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    if (params->varlen.padded_kv_blocks <= 0 || params->varlen.total_k <= 0) return cudaSuccess;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return msa::dispatch_arch([&] { return msa::backward_dkv_sm80(*params, s); });
}
