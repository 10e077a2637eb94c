// Backward main kernel, KV-outer with atomics (NeMo's task walk, docs/contract.md §5, with
// mma.sync instead of tcgen05). Each CTA walks its interval of task rows (8 query slots of one
// (group, physical block) bucket) as 64-row half tiles: K/V resident per bucket, Q/dO of the next
// half tile prefetched while the current one finishes, dQ reduced per half tile into
// dq_accum, dK/dV accumulated in registers per bucket segment and reduced into the fp32
// workspace pools at its end. The math is mainloop_kv_outer_sm80.cuh, shared with the deterministic
// dK/dV kernel.
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/arch_dispatch.cuh"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"
#include "common/varlen.cuh"
#include "common/sm80/cp_async.cuh"
#include "attention/task_walk.cuh"
#include "attention/mainloop_kv_outer_sm80.cuh"

namespace msa {
namespace {

// Reduces the segment's dK/dV (warp w: keys 16 w + g, 16 w + g + 8) into the pools at workspace
// rows kblock * 128 + key; keys past the block's stored count only hold zeros and are skipped.
__device__ __forceinline__ void flush_to_pools(const float (&dk)[kAccTiles][4], const float (&dv)[kAccTiles][4],
                                               float* __restrict__ dk_pool, float* __restrict__ dv_pool, int kblock,
                                               int count, int g) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = 16 * warp + (lane >> 2) + 8 * r;
        if (key >= count) continue;
        const int64_t off =
            (static_cast<int64_t>(kblock) * kBlock + key) * kKRowElems + g * kHeadDim + 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < kAccTiles; ++nt) {
            red_add_f32x2(dk_pool + off + 8 * nt, dk[nt][2 * r], dk[nt][2 * r + 1]);
            red_add_f32x2(dv_pool + off + 8 * nt, dv[nt][2 * r], dv[nt][2 * r + 1]);
        }
    }
}

__global__ void __launch_bounds__(kKvOuterThreads, 1)
    attn_backward_main_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                              const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              const int32_t* __restrict__ task_meta, const int32_t* __restrict__ task_qrows,
                              const int32_t* __restrict__ task_qpos, const int32_t* __restrict__ desc,
                              const MsaVarlen varlen, float* __restrict__ dq_accum, float* __restrict__ dk_pool,
                              float* __restrict__ dv_pool) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    KvOuterSmem& s = *reinterpret_cast<KvOuterSmem*>(smem_raw);
    const RowInterval iv = cta_row_interval(desc, blockIdx.x);
    if (iv.lo >= iv.hi) return;  // CTA-uniform

    // Slot i of half `half` of task row `row` is query slot 4 half + i; slots past `valid`, with
    // row -1, or out of range contribute nothing. task_qpos is the query's workspace position, so
    // visibility against block kblock is visible_keys(qpos, kblock, count).
    auto slot_of = [&](int row, const TaskRow& tr, const BlockKeys& bk, int half) {
        return [=](int i) -> SlotInfo {
            const int slot = kSlotsPerHalf * half + i;
            if (slot >= tr.valid) return invalid_slot();
            const int64_t at = static_cast<int64_t>(row) * kSlotsPerTask + slot;
            const int qrow = task_qrows[at];
            if (qrow < 0 || qrow >= varlen.total_q) return invalid_slot();
            return SlotInfo{qrow, visible_keys(task_qpos[at], tr.kblock, bk.count)};
        };
    };

    int row = iv.lo, half = 0, buf = 0;
    TaskRow tr = load_task_row(task_meta, row);
    BlockKeys bk = block_keys(varlen, tr.kblock);
    kv_outer_load_block(s, k, v, tr.g, bk);
    kv_outer_load_half(s, buf, q, dout, lse, delta, tr.g, slot_of(row, tr, bk, half));
    cp_async_commit();

    float dk[kAccTiles][4], dv[kAccTiles][4];
    zero_acc(dk);
    zero_acc(dv);
    while (true) {
        cp_async_wait<0>();
        __syncthreads();  // K/V (at a segment start), Q/dO and row scalars have landed
        kv_outer_scores(s, buf);
        __syncthreads();  // P, dS complete
        kv_outer_dkv(s, buf, dk, dv);
        __syncthreads();  // Q, dO, P are free; dS and K are still read by phase 3

        // Next half tile: the second half of this row if it has more than 4 slots, else the next
        // row of the interval.
        int next_row = row, next_half = half + 1;
        if (next_half == 2 || tr.valid <= kSlotsPerHalf) {
            next_row = row + 1;
            next_half = 0;
        }
        const bool has_next = next_row < iv.hi;
        TaskRow ntr = tr;
        BlockKeys nbk = bk;
        bool same = true;
        if (has_next && next_row != row) {
            ntr = load_task_row(task_meta, next_row);
            same = same_bucket(tr, ntr);
            if (!same) nbk = block_keys(varlen, ntr.kblock);
        }
        if (has_next) {
            kv_outer_load_half(s, buf ^ 1, q, dout, lse, delta, ntr.g, slot_of(next_row, ntr, nbk, next_half));
            cp_async_commit();
        }

        kv_outer_dq(s, buf, dq_accum, tr.g);
        if (!has_next || !same) {  // segment end
            flush_to_pools(dk, dv, dk_pool, dv_pool, tr.kblock, bk.count, tr.g);
            zero_acc(dk);
            zero_acc(dv);
        }
        if (!has_next) break;
        __syncthreads();  // phase 3 is done with dS and K
        if (!same) {
            kv_outer_load_block(s, k, v, ntr.g, nbk);
            cp_async_commit();
        }
        row = next_row;
        half = next_half;
        tr = ntr;
        bk = nbk;
        buf ^= 1;
    }
}

cudaError_t backward_main_sm80(const MsaAttnBwdParams& p, cudaStream_t stream) {
    return launch_smem(attn_backward_main_kernel, p.grid_launch, kKvOuterThreads, sizeof(KvOuterSmem), stream, p.q,
                       p.k, p.v, p.dout, p.lse, p.delta, p.task_meta, p.task_qrows, p.task_qpos, p.desc, p.varlen,
                       p.dq_accum, p.dk_pool, p.dv_pool);
}

}  // namespace
}  // namespace msa

extern "C" int msa_attn_backward_main(const MsaAttnBwdParams* params, void* stream) {
    if (params == nullptr) return cudaErrorInvalidValue;
    if (params->grid_launch <= 0) return cudaSuccess;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return msa::dispatch_arch([&] { return msa::backward_main_sm80(*params, s); });
}
