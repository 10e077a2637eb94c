// The index LSE the KL backward takes (docs/contract.md §3.2, consistency): for index head g
// and query t at document position p, the natural-log logsumexp of s_j = qi[t, g].ki[k_base + j]
// * 128^-0.5 over the attention's own token set {j : j / 128 in topk[g, t, :], j <= p}; -inf when
// the set is empty. The same set rule as msa_ref::indexer::selection_lse: entries outside
// [0, p / 128] are skipped and a repeated entry counts once.
//
// One warp per (head, query), no atomics and a fixed order, so repeated calls are bitwise equal.
// A quad of lanes shares a key (each lane one quarter of the 128 dims), so a pass covers 8 keys
// and a quad reads 64 contiguous bytes per load; the quad's first lane keeps the running (max,
// sum) of its keys, and the warp merges them once at the end.
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "msa/indexer.h"
#include "common/constants.cuh"
#include "common/intrinsics.cuh"
#include "common/varlen.cuh"

namespace msa {
namespace {

constexpr int kIndexHeads = kGroups;  // index head g selects for KV group g
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kQuadKeys = 8;  // keys per pass: one per quad
constexpr int kRowChunks = kHeadDim * static_cast<int>(sizeof(uint16_t)) / static_cast<int>(sizeof(uint4));
constexpr int kChunks = kRowChunks / 4;  // 16-byte chunks of a row per lane

// Lane chunk c of a 128-dim bf16 row: 16-byte chunk 4 c + (lane & 3), so the quad's loads of one
// c are contiguous.
__device__ __forceinline__ uint4 row_chunk(const uint16_t* row, int c, int part) {
    return __ldg(reinterpret_cast<const uint4*>(row) + 4 * c + part);
}


__device__ __forceinline__ float dot8(const float* q, uint4 k) {
    const uint32_t w[4] = {k.x, k.y, k.z, k.w};
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) d = fmaf(q[2 * i], bf16_lo(w[i]), fmaf(q[2 * i + 1], bf16_hi(w[i]), d));
    return d;
}

__global__ void __launch_bounds__(kThreads)
    selection_lse_kernel(const uint16_t* __restrict__ qi, const uint16_t* __restrict__ ki,
                         const int32_t* __restrict__ topk, const MsaVarlen v, float* __restrict__ lse) {
    constexpr unsigned kFull = 0xffffffffu;
    const int lane = threadIdx.x & 31, part = lane & 3;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (row >= static_cast<int64_t>(kIndexHeads) * v.total_q) return;  // warp-uniform
    const int g = static_cast<int>(row / v.total_q), t = static_cast<int>(row % v.total_q);
    const QueryCoord c = query_coord(v, t);
    const int local = c.pos / kBlock;
    const int wpos = c.phys_base * kBlock + c.pos;

    float q[kChunks * 8];
    const uint16_t* q_row = qi + (static_cast<int64_t>(t) * kIndexHeads + g) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
        const uint4 w = row_chunk(q_row, i, part);
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            q[8 * i + 2 * j] = bf16_lo(ws[j]);
            q[8 * i + 2 * j + 1] = bf16_hi(ws[j]);
        }
    }

    // Slot s of the selection lives in lane s; every lane sees every entry through a shuffle.
    const int32_t mine = lane < kTopK ? topk[row * kTopK + lane] : -1;
    float m = -INFINITY, sum = 0.f;  // this lane's keys (quad leaders only)
    for (int slot = 0; slot < kTopK; ++slot) {
        const int e = __shfl_sync(kFull, mine, slot);
        const bool repeated = __any_sync(kFull, lane < slot && mine == e);
        if (e < 0 || e > local || repeated) continue;  // warp-uniform
        const int pb = c.phys_base + e;
        const BlockKeys keys = block_keys(v, pb);
        const int n = visible_keys(wpos, pb, keys.count);
        for (int r0 = 0; r0 < n; r0 += kQuadKeys) {
            const int r = r0 + (lane >> 2);
            float d = 0.f;
            if (r < n) {
                const uint16_t* k_row = ki + (static_cast<int64_t>(keys.start) + r) * kHeadDim;
#pragma unroll
                for (int i = 0; i < kChunks; ++i) d += dot8(q + 8 * i, row_chunk(k_row, i, part));
            }
            d = quad_sum(d);
            if (part == 0 && r < n) {
                const float x = d * kScale;
                if (x > m) {
                    sum = sum * expf(m - x) + 1.f;
                    m = x;
                } else {
                    sum += expf(x - m);
                }
            }
        }
    }

    float top = m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(kFull, top, o));
    float total = m == -INFINITY ? 0.f : sum * expf(m - top);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(kFull, total, o);
    if (lane == 0) lse[row] = top == -INFINITY ? -INFINITY : top + logf(total);
}

}  // namespace
}  // namespace msa

extern "C" int msa_indexer_selection_lse(const uint16_t* qi, const uint16_t* ki, const int32_t* topk,
                                         MsaVarlen varlen, float* lse, void* stream) {
    if (varlen.total_q < 0) return cudaErrorInvalidValue;
    if (varlen.total_q == 0) return cudaSuccess;
    const int64_t rows = static_cast<int64_t>(msa::kIndexHeads) * varlen.total_q;
    const int64_t ctas = (rows + msa::kWarps - 1) / msa::kWarps;
    msa::selection_lse_kernel<<<static_cast<unsigned>(ctas), msa::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        qi, ki, topk, varlen, lse);
    return cudaGetLastError();
}
