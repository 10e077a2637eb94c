// Backward pre/postprocess family (kernels/include/msa/pre_post.h): delta = rowsum(out * dout)
// and the bf16 casts of the fp32 gradient accumulators. Memory-bound streaming kernels with
// 16-byte accesses; the casts round to nearest even, the host's bf16::from_f32.

#include "msa/pre_post.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/constants.cuh"
#include "common/launch.cuh"

namespace {

using msa::kBlock;
using msa::kGroups;
using msa::kHeadDim;
using msa::kHeads;
constexpr int kThreads = 256;
constexpr int kVec = 8;                          // elements per thread and access
constexpr int kLanesPerRow = kHeadDim / kVec;    // 16: one (t, h) row per half warp
constexpr int kRowsPerCta = kThreads / kLanesPerRow;
constexpr int kKvRowVecs = kGroups * kHeadDim / kVec;  // 64 vectors per [4, 128] key row
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Two fp32 values -> one bf16x2 word (first value in the low half, i.e. at the lower address).
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
}

// 8 fp32 at src (16-byte aligned) -> 8 bf16 at dst (16-byte aligned).
__device__ __forceinline__ void cast8(const float* __restrict__ src, uint16_t* __restrict__ dst) {
    const float4 a = reinterpret_cast<const float4*>(src)[0];
    const float4 b = reinterpret_cast<const float4*>(src)[1];
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y),
                   pack_bf16x2(b.z, b.w));
}

__global__ void __launch_bounds__(kThreads)
    delta_kernel(const uint16_t* __restrict__ out, const uint16_t* __restrict__ dout, long long rows,
                 float* __restrict__ delta) {
    const long long row = static_cast<long long>(blockIdx.x) * kRowsPerCta + threadIdx.x / kLanesPerRow;
    const int part = int(threadIdx.x % kLanesPerRow);
    float acc = 0.f;
    if (row < rows) {
        const size_t at = static_cast<size_t>(row) * kHeadDim + size_t(part) * kVec;
        const uint4 o = *reinterpret_cast<const uint4*>(out + at);
        const uint4 g = *reinterpret_cast<const uint4*>(dout + at);
        // bf16 x bf16 is exact in fp32, so fma and mul+add round alike.
        acc = bf16_lo(o.x) * bf16_lo(g.x);
        acc = fmaf(bf16_hi(o.x), bf16_hi(g.x), acc);
        acc = fmaf(bf16_lo(o.y), bf16_lo(g.y), acc);
        acc = fmaf(bf16_hi(o.y), bf16_hi(g.y), acc);
        acc = fmaf(bf16_lo(o.z), bf16_lo(g.z), acc);
        acc = fmaf(bf16_hi(o.z), bf16_hi(g.z), acc);
        acc = fmaf(bf16_lo(o.w), bf16_lo(g.w), acc);
        acc = fmaf(bf16_hi(o.w), bf16_hi(g.w), acc);
    }
    // Every lane shuffles (rows past the end hold 0), so the full mask is exact.
#pragma unroll
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
        acc += __shfl_xor_sync(kFullMask, acc, offset, kLanesPerRow);
    }
    if (part == 0 && row < rows) delta[row] = acc;
}

__global__ void __launch_bounds__(kThreads)
    dq_kernel(const float* __restrict__ accum, long long vecs, uint16_t* __restrict__ dq) {
    const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (i < vecs) cast8(accum + i * kVec, dq + i * kVec);
}

__global__ void __launch_bounds__(kThreads)
    dkv_kernel(const float* __restrict__ dk_pool, const float* __restrict__ dv_pool, MsaVarlen v,
               uint16_t* __restrict__ dk, uint16_t* __restrict__ dv) {
    const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    const long long ws_row = i / kKvRowVecs;
    if (ws_row >= static_cast<long long>(v.padded_kv_blocks) * kBlock) return;
    const int part = int(i % kKvRowVecs);
    const int pb = int(ws_row / kBlock);
    const int r = int(ws_row % kBlock);
    const int start = v.block_key_start[pb];
    // Padding blocks (start -1, count 0) and rows past the stored keys have no packed row; the
    // total_k bound only guards against a malformed layout.
    if (start < 0 || r >= v.block_key_count[pb] || start + r >= v.total_k) return;
    const float* pool = blockIdx.y == 0 ? dk_pool : dv_pool;
    uint16_t* grad = blockIdx.y == 0 ? dk : dv;
    const size_t src = static_cast<size_t>(ws_row) * (kGroups * kHeadDim) + size_t(part) * kVec;
    const size_t dst = static_cast<size_t>(start + r) * (kGroups * kHeadDim) + size_t(part) * kVec;
    cast8(pool + src, grad + dst);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned grid_for(long long items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace

extern "C" int msa_pre_post_delta(const uint16_t* out, const uint16_t* dout, int32_t total_q,
                                  float* delta, void* stream) {
    if (total_q < 0 || !aligned16(out) || !aligned16(dout) || !aligned16(delta)) {
        return cudaErrorInvalidValue;
    }
    if (total_q == 0) return cudaSuccess;
    const long long rows = static_cast<long long>(total_q) * kHeads;
    return msa::launch(delta_kernel, unsigned((rows + kRowsPerCta - 1) / kRowsPerCta), kThreads,
                       static_cast<cudaStream_t>(stream), out, dout, rows, delta);
}

extern "C" int msa_pre_post_dq(const float* dq_accum, int32_t total_q, uint16_t* dq, void* stream) {
    if (total_q < 0 || !aligned16(dq_accum) || !aligned16(dq)) return cudaErrorInvalidValue;
    if (total_q == 0) return cudaSuccess;
    const long long vecs = static_cast<long long>(total_q) * kHeads * kHeadDim / kVec;
    return msa::launch(dq_kernel, grid_for(vecs), kThreads, static_cast<cudaStream_t>(stream), dq_accum,
                       vecs, dq);
}

extern "C" int msa_pre_post_dkv(const float* dk_pool, const float* dv_pool, MsaVarlen varlen,
                                uint16_t* dk, uint16_t* dv, void* stream) {
    if (varlen.padded_kv_blocks < 0 || varlen.total_k < 0 || !aligned16(dk_pool) ||
        !aligned16(dv_pool) || !aligned16(dk) || !aligned16(dv)) {
        return cudaErrorInvalidValue;
    }
    if (varlen.padded_kv_blocks == 0 || varlen.total_k == 0) return cudaSuccess;
    const long long vecs = static_cast<long long>(varlen.padded_kv_blocks) * kBlock * kKvRowVecs;
    return msa::launch(dkv_kernel, dim3(grid_for(vecs), 2), kThreads, static_cast<cudaStream_t>(stream),
                       dk_pool, dv_pool, varlen, dk, dv);
}
