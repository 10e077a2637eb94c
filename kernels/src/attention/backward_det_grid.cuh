// Deterministic mode of the sm_90a backward: dQ accumulated exactly, so that the order of the
// bulk reduce-adds cannot change a bit (host mirror of the grid: msa_plan::backward::det_grid).
//
// Each dQ row (query t, head h: 128 fp32) receives one contribution per selected block, from
// whichever CTA processes that block's item, in an order that varies from run to run. The main
// kernel rounds every contribution to a multiple of a per-row power of two, step = 2^e, chosen
// before the backward from a bound B on the sum of the contributions' magnitudes:
//   sum over blocks of |c| <= scale * sum_k P_k |dP_k - delta| |K_k[d]|
//                          <= scale * max over selected blocks b of (|dO| Vn_b + |delta|) Ka_b
// (|dP_k| = |dO . V_k| <= |dO| |V_k|, the P_k sum to 1), with Ka_b = max |K| and Vn_b = max |V_k|_2
// over block b's keys. With 2^(e + 22) >= B (x 1.01 for dS's bf16 rounding and the sums' own),
// every partial sum is an integer multiple of 2^e below 2^(e + 24): exact in fp32, in any order.
// The rounding moves a contribution by at most 2^(e - 1) <= B 2^-23, far below the bf16 output's
// half ulp for any element near the bound. e >= -126 keeps every multiple a normal number (no
// flush to zero in the reduce-add); a non-finite bound gives a NaN step, which carries into dQ.
// dK and dV need no grid: a split row keeps a part per item, summed in id order by the epilogue.
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/varlen.cuh"

namespace msa::bwd90 {

constexpr int kGridSlack = 22;  // 2^(e + 22) >= B: partial sums stay below 2^(e + 24)
constexpr int kGridMinExp = -126;
constexpr int kGridMaxExp = 127 - 24;

// A contribution rounded to the row's grid; `step` = 2^e (or NaN). x * 2^-e is exact, and so is
// the product back: |x| 2^-e <= 2^22.
__device__ __forceinline__ float to_grid(float x, float step) {
    const float inv = __int_as_float(0x7f000000 - __float_as_int(step));  // 2^-e
    return rintf(x * inv) * step;
}

// The grid of a row with bound b (see above), as a float 2^e; NaN when b is not finite.
__device__ __forceinline__ float grid_step(float b) {
    if (!isfinite(b)) return __int_as_float(0x7fffffff);
    int e = kGridMinExp;
    if (b > 0.f) {
        int x;
        frexpf(b, &x);  // b < 2^x
        e = x - kGridSlack;
        e = e < kGridMinExp ? kGridMinExp : (e > kGridMaxExp ? kGridMaxExp : e);
    }
    return __int_as_float((127 + e) << 23);
}

namespace {  // internal linkage: each including translation unit launches its own

constexpr int kBoundThreads = 128;

// Per (physical block pb, group g) with a CSR entry: kv_bound[(g P + pb) * 2] = max |K| over the
// block's keys and dims, + 1 = max |V_k|_2 (blocks nobody selected are never read: on a long
// document most of the keys). Grid (P, 4); a half warp per key row (256 coalesced bytes each of
// K and V). Maxima of non-negative floats are order-free.
__global__ void __launch_bounds__(kBoundThreads)
    backward_kv_bound_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                             const int32_t* __restrict__ phys_row_ptr, const MsaVarlen varlen,
                             float* __restrict__ kv_bound) {
    const int pb = blockIdx.x, g = blockIdx.y, P = varlen.padded_kv_blocks;
    const int32_t* row_ptr = phys_row_ptr + static_cast<int64_t>(g) * (P + 1);
    if (row_ptr[pb + 1] == row_ptr[pb]) return;
    const BlockKeys bk = block_keys(varlen, pb);
    const int part = threadIdx.x & 15;
    float ka = 0.f, vn = 0.f;
    // The trip count is the CTA's (a half warp past the block's keys reads zeros), so that both
    // halves of a warp reach every full-mask shuffle: a key-bound loop hung on partial blocks
    // (run 54).
    for (int k0 = 0; k0 < bk.count; k0 += kBoundThreads / 16) {
        const int key = k0 + static_cast<int>(threadIdx.x >> 4);
        uint4 a = make_uint4(0, 0, 0, 0), b = a;
        if (key < bk.count) {
            const int64_t at = (static_cast<int64_t>(bk.start) + key) * kKRowElems + g * kHeadDim + part * 8;
            a = *reinterpret_cast<const uint4*>(k + at);
            b = *reinterpret_cast<const uint4*>(v + at);
        }
        const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
        float vs = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            ka = fmaxf(ka, fmaxf(fabsf(bf16_lo(aw[j])), fabsf(bf16_hi(aw[j]))));
            vs = fmaf(bf16_lo(bw[j]), bf16_lo(bw[j]), vs);
            vs = fmaf(bf16_hi(bw[j]), bf16_hi(bw[j]), vs);
        }
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) vs += __shfl_xor_sync(0xffffffffu, vs, o, 16);
        vn = fmaxf(vn, sqrtf(vs) * 1.0001f);  // the rounded sum and root stay below x 1.0001
    }
    __shared__ float red[2][kBoundThreads / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ka = fmaxf(ka, __shfl_xor_sync(0xffffffffu, ka, o));
        vn = fmaxf(vn, __shfl_xor_sync(0xffffffffu, vn, o));
    }
    if ((threadIdx.x & 31) == 0) {
        red[0][threadIdx.x >> 5] = ka;
        red[1][threadIdx.x >> 5] = vn;
    }
    __syncthreads();
    if (threadIdx.x < 2) {
        float m = 0.f;
#pragma unroll
        for (int w = 0; w < kBoundThreads / 32; ++w) m = fmaxf(m, red[threadIdx.x][w]);
        kv_bound[(static_cast<int64_t>(g) * P + pb) * 2 + threadIdx.x] = m;
    }
}

constexpr int kStepThreads = 256;  // a half warp per (query, group)

// dq_step [T, 64]: the grid step of each dQ row from |dO| (dout_norm, written by the delta
// preprocess), delta and the bounds of the row's selected blocks (topk [4, T, 16], document-local
// ids, -1 padding). Grid ceil(4T / 16) (t-major): lane l of a half warp reads head l's norm and
// delta and selection entry l with its block's bounds, every load issued before the first use.
__global__ void __launch_bounds__(kStepThreads)
    backward_dq_step_kernel(const float* __restrict__ dout_norm, const float* __restrict__ delta,
                            const int32_t* __restrict__ topk, const float* __restrict__ kv_bound,
                            const MsaVarlen varlen, float* __restrict__ dq_step) {
    const int tg = blockIdx.x * (kStepThreads / 16) + static_cast<int>(threadIdx.x >> 4);
    const int l = threadIdx.x & 15;
    const bool live = tg < varlen.total_q * kGroups;  // half-warp uniform; every lane shuffles
    float dn = 0.f, dl = 0.f, ka = 0.f, vn = 0.f;
    int64_t row = 0;
    if (live) {
        const int t = tg / kGroups, g = tg % kGroups;
        row = static_cast<int64_t>(t) * kHeads + g * kHeadsPerGroup + l;
        dn = dout_norm[row] * 1.0001f;  // the rounded sum and root stay below x 1.0001
        dl = fabsf(delta[row]);
        const int b = topk[(static_cast<int64_t>(g) * varlen.total_q + t) * kTopK + l];
        const int pb = query_coord(varlen, t).phys_base + b;
        if (b >= 0 && pb < varlen.padded_kv_blocks) {
            const float2 kb =
                *reinterpret_cast<const float2*>(kv_bound + (static_cast<int64_t>(g) * varlen.padded_kv_blocks + pb) * 2);
            ka = kb.x;
            vn = kb.y;
        }
    }
    float term = 0.f;
#pragma unroll
    for (int j = 0; j < kTopK; ++j)
        term = fmaxf(term, fmaf(dn, __shfl_sync(0xffffffffu, vn, j, 16), dl) * __shfl_sync(0xffffffffu, ka, j, 16));
    if (live) dq_step[row] = grid_step(term * (kScale * 1.01f));
}

}  // namespace

static_assert(kTopK == kHeadsPerGroup && kTopK == 16, "backward_dq_step_kernel: a half warp's lane is a head and a selection entry");

}  // namespace msa::bwd90
