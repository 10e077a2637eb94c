// Backward postprocess (nemo-kernels §5.5; docs/design.md "Backward" step 4): the casts of the
// fp32 accumulators of the atomic backward to the bf16 gradients, dQ element for element and
// dK/dV gathered from the workspace pools to the packed key rows. Memory-bound streaming kernels
// with 16-byte accesses; the casts round to nearest even, the host's bf16::from_f32. No scale
// here: the softmax scale rides on dS. Arch-neutral, so there is no per-architecture path.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/constants.cuh"
#include "common/launch.cuh"

namespace msa {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;                                // elements per thread and access
constexpr int kKvRowVecs = kGroups * kHeadDim / kVec;  // 64 vectors per [4, 128] key row

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
    attn_backward_postprocess_dq_kernel(const float* __restrict__ accum, long long vecs, uint16_t* __restrict__ dq) {
    const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (i < vecs) cast8(accum + i * kVec, dq + i * kVec);
}

__global__ void __launch_bounds__(kThreads)
    attn_backward_postprocess_dkv_kernel(const float* __restrict__ dk_pool, const float* __restrict__ dv_pool,
                                         MsaVarlen v, uint16_t* __restrict__ dk, uint16_t* __restrict__ dv) {
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

unsigned grid_for(long long items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace
}  // namespace msa

extern "C" int msa_attn_backward_postprocess_dq(const float* dq_accum, int32_t total_q, uint16_t* dq, void* stream) {
    if (total_q < 0 || !msa::aligned16(dq_accum) || !msa::aligned16(dq)) return cudaErrorInvalidValue;
    if (total_q == 0) return cudaSuccess;
    const long long vecs = static_cast<long long>(total_q) * msa::kHeads * msa::kHeadDim / msa::kVec;
    return msa::launch(msa::attn_backward_postprocess_dq_kernel, msa::grid_for(vecs), msa::kThreads,
                       static_cast<cudaStream_t>(stream), dq_accum, vecs, dq);
}

extern "C" int msa_attn_backward_postprocess_dkv(const float* dk_pool, const float* dv_pool, MsaVarlen varlen,
                                                 uint16_t* dk, uint16_t* dv, void* stream) {
    if (varlen.padded_kv_blocks < 0 || varlen.total_k < 0 || !msa::aligned16(dk_pool) || !msa::aligned16(dv_pool) ||
        !msa::aligned16(dk) || !msa::aligned16(dv)) {
        return cudaErrorInvalidValue;
    }
    if (varlen.padded_kv_blocks == 0 || varlen.total_k == 0) return cudaSuccess;
    const long long vecs = static_cast<long long>(varlen.padded_kv_blocks) * msa::kBlock * msa::kKvRowVecs;
    return msa::launch(msa::attn_backward_postprocess_dkv_kernel, dim3(msa::grid_for(vecs), 2), msa::kThreads,
                       static_cast<cudaStream_t>(stream), dk_pool, dv_pool, varlen, dk, dv);
}
