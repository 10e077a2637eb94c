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
// dK and dV need no grid: their split rows add in a fixed order (backward_order.cuh).
#pragma once

#include <cstdint>

#include "msa/common.h"
#include "common/constants.cuh"
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

constexpr int kBoundThreads = 128;  // one key of the block per thread

__device__ __forceinline__ float bf16_lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi_f(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Per (physical block pb, group g): kv_bound[(g P + pb) * 2] = max |K| over the block's keys and
// dims, + 1 = max |V_k|_2 (0 for blocks without keys). Grid (P, 4). Maxima of non-negative floats
// compare as integers, so the result is order-free.
__global__ void __launch_bounds__(kBoundThreads)
    backward_kv_bound_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v, const MsaVarlen varlen,
                             float* __restrict__ kv_bound) {
    const int pb = blockIdx.x, g = blockIdx.y;
    const BlockKeys bk = block_keys(varlen, pb);
    float ka = 0.f, vn = 0.f;
    if (static_cast<int>(threadIdx.x) < bk.count) {
        const int64_t at = (static_cast<int64_t>(bk.start) + threadIdx.x) * kKRowElems + g * kHeadDim;
        const uint4* kr = reinterpret_cast<const uint4*>(k + at);
        const uint4* vr = reinterpret_cast<const uint4*>(v + at);
        float vs = 0.f;
#pragma unroll
        for (int i = 0; i < kHeadDim / 8; ++i) {
            const uint4 a = kr[i], b = vr[i];
            const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                ka = fmaxf(ka, fmaxf(fabsf(bf16_lo_f(aw[j])), fabsf(bf16_hi_f(aw[j]))));
                vs = fmaf(bf16_lo_f(bw[j]), bf16_lo_f(bw[j]), vs);
                vs = fmaf(bf16_hi_f(bw[j]), bf16_hi_f(bw[j]), vs);
            }
        }
        vn = sqrtf(vs) * 1.0001f;  // the rounded sum and root stay below the true norm x 1.0001
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
        kv_bound[(static_cast<int64_t>(g) * varlen.padded_kv_blocks + pb) * 2 + threadIdx.x] = m;
    }
}

constexpr int kStepThreads = 256;  // one (query, group) per CTA: a half warp per head

// dq_step [T, 64]: the grid step of each dQ row from |dO| (read here), delta and the bounds of the
// row's selected blocks (topk [4, T, 16], document-local ids, -1 padding). Grid 4T (t-major).
__global__ void __launch_bounds__(kStepThreads)
    backward_dq_step_kernel(const uint16_t* __restrict__ dout, const float* __restrict__ delta,
                            const int32_t* __restrict__ topk, const float* __restrict__ kv_bound,
                            const MsaVarlen varlen, float* __restrict__ dq_step) {
    const int t = blockIdx.x / kGroups, g = blockIdx.x % kGroups;
    const int h = g * kHeadsPerGroup + static_cast<int>(threadIdx.x >> 4), part = threadIdx.x & 15;
    const int64_t row = static_cast<int64_t>(t) * kHeads + h;
    const uint4 w = *reinterpret_cast<const uint4*>(dout + row * kHeadDim + part * 8);
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        ss = fmaf(bf16_lo_f(ws[j]), bf16_lo_f(ws[j]), ss);
        ss = fmaf(bf16_hi_f(ws[j]), bf16_hi_f(ws[j]), ss);
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o, 16);
    const float dn = sqrtf(ss) * 1.0001f, dl = fabsf(delta[row]);
    // Lane `part` takes selection entry `part` (kTopK == 16 entries, one per lane of the half).
    const QueryCoord qc = query_coord(varlen, t);
    const int b = topk[(static_cast<int64_t>(g) * varlen.total_q + t) * kTopK + part];
    float term = 0.f;
    if (b >= 0) {
        const int pb = qc.phys_base + b;
        if (pb < varlen.padded_kv_blocks) {
            const float* kb = kv_bound + (static_cast<int64_t>(g) * varlen.padded_kv_blocks + pb) * 2;
            term = fmaf(dn, kb[1], dl) * kb[0];
        }
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) term = fmaxf(term, __shfl_xor_sync(0xffffffffu, term, o, 16));
    if (part == 0) dq_step[row] = grid_step(term * (kScale * 1.01f));
}

}  // namespace

static_assert(kTopK == 16, "backward_dq_step_kernel: one selection entry per lane of a half warp");

}  // namespace msa::bwd90
