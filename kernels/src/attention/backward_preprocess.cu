// Backward preprocess (nemo-kernels §5.3; docs/design.md "Backward" step 1): delta =
// rowsum(out * dout), the input of every backward kernel. A memory-bound streaming kernel with
// 16-byte loads; arch-neutral (no tensor cores), so it has no per-architecture path.

#include <cstdint>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/launch.cuh"

namespace msa {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;                        // elements per thread and access
constexpr int kLanesPerRow = kHeadDim / kVec;  // 16: one (t, h) row per half warp
constexpr int kRowsPerCta = kThreads / kLanesPerRow;
constexpr unsigned kFullMask = 0xffffffffu;


// kNorm: also dout_norm = |dout| per row, from the same loads.
template <bool kNorm>
__global__ void __launch_bounds__(kThreads)
    attn_backward_preprocess_kernel(const uint16_t* __restrict__ out, const uint16_t* __restrict__ dout,
                                    long long rows, float* __restrict__ delta, float* __restrict__ dout_norm) {
    const long long row = static_cast<long long>(blockIdx.x) * kRowsPerCta + threadIdx.x / kLanesPerRow;
    const int part = int(threadIdx.x % kLanesPerRow);
    float acc = 0.f, sq = 0.f;
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
        if constexpr (kNorm) {
            const unsigned gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                sq = fmaf(bf16_lo(gw[i]), bf16_lo(gw[i]), sq);
                sq = fmaf(bf16_hi(gw[i]), bf16_hi(gw[i]), sq);
            }
        }
    }
    // Every lane shuffles (rows past the end hold 0), so the full mask is exact.
#pragma unroll
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
        acc += __shfl_xor_sync(kFullMask, acc, offset, kLanesPerRow);
        if constexpr (kNorm) sq += __shfl_xor_sync(kFullMask, sq, offset, kLanesPerRow);
    }
    if (part == 0 && row < rows) {
        delta[row] = acc;
        if constexpr (kNorm) dout_norm[row] = sqrtf(sq);
    }
}

}  // namespace
}  // namespace msa

namespace {

int preprocess(const uint16_t* out, const uint16_t* dout, int32_t total_q, float* delta, float* dout_norm,
               void* stream) {
    if (total_q < 0 || !msa::aligned16(out) || !msa::aligned16(dout) || !msa::aligned16(delta)) {
        return cudaErrorInvalidValue;
    }
    if (total_q == 0) return cudaSuccess;
    const long long rows = static_cast<long long>(total_q) * msa::kHeads;
    const unsigned grid = unsigned((rows + msa::kRowsPerCta - 1) / msa::kRowsPerCta);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dout_norm != nullptr)
        return msa::launch(msa::attn_backward_preprocess_kernel<true>, grid, msa::kThreads, s, out, dout, rows, delta,
                           dout_norm);
    return msa::launch(msa::attn_backward_preprocess_kernel<false>, grid, msa::kThreads, s, out, dout, rows, delta,
                       dout_norm);
}

}  // namespace

extern "C" int msa_attn_backward_preprocess(const uint16_t* out, const uint16_t* dout, int32_t total_q,
                                            float* delta, void* stream) {
    return preprocess(out, dout, total_q, delta, nullptr, stream);
}

extern "C" int msa_attn_backward_preprocess_norm(const uint16_t* out, const uint16_t* dout, int32_t total_q,
                                                 float* delta, float* dout_norm, void* stream) {
    if (dout_norm == nullptr) return cudaErrorInvalidValue;
    return preprocess(out, dout, total_q, delta, dout_norm, stream);
}
