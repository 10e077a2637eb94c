// Shared pieces of the naive GPU references (msa/reference.h): the contract's constants, the
// coordinates of a query, its selected blocks as a set, and 128-thread block reductions.
// Written from docs/contract.md §1-§3 only; nothing here is shared with the kernels under test.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "msa/common.h"

namespace msa_reference {

constexpr int kHeads = 64;         // query heads
constexpr int kGroups = 4;         // KV groups (and index heads); head h reads group h / 16
constexpr int kHeadsPerGroup = 16;
constexpr int kDim = 128;          // head dim = index dim
constexpr int kBlock = 128;        // keys per block
constexpr int kTopK = 16;          // selection slots
constexpr int kMaxKeys = kTopK * kBlock;
constexpr float kScale = 0.088388347648318440550f;  // 128^-0.5

constexpr int kThreads = 128;      // every reference CTA: one thread per dim or per key
constexpr int kDimsPerCta = 32;    // dims of dK/dV/dKI one key-block CTA accumulates
constexpr int kRowPad = kDim + 2;  // shared-memory row stride (bf16): row i starts at bank i

// An exact bf16 -> fp32 conversion of the raw bits.
__device__ __forceinline__ float bf(uint16_t x) { return __uint_as_float(uint32_t(x) << 16); }

// Round to the nearest bf16 (ties to even), as an fp32.
__device__ __forceinline__ float round_bf16(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

// Query t of the packed layout: its document's first K row and its document position.
struct Query {
    int k_base;  // packed K row of document key 0
    int pos;     // document position p = k_len - q_len + (t - cu_seqlens_q[b])
};

__device__ __forceinline__ Query query_of(const MsaVarlen& v, int t) {
    const int b = v.query_fragment[t];
    const int first = v.fragment_first[b];
    const int q_start = v.cu_seqlens_q[b];
    Query c;
    c.k_base = v.cu_seqlens_k[first];
    const int k_len = v.cu_seqlens_k[b + 1] - c.k_base;
    const int q_len = v.cu_seqlens_q[b + 1] - q_start;
    c.pos = k_len - q_len + (t - q_start);
    return c;
}

// The distinct blocks 0 <= e <= pos / 128 listed in topk[g, t, :], ascending, into blocks[16];
// returns how many. Every other entry (-1, negative, future, past the document) is ignored and a
// repeated entry counts once: the set the contract defines. Run by one thread.
__device__ inline int selected_blocks(const int32_t* topk, int total_q, int t, int g, int pos,
                                      int* blocks) {
    const int own = pos / kBlock;
    const int32_t* row = topk + (size_t(g) * total_q + t) * kTopK;
    int n = 0;
    for (int s = 0; s < kTopK; ++s) {
        const int e = row[s];
        if (e < 0 || e > own) {
            continue;
        }
        bool seen = false;
        for (int a = 0; a < n; ++a) {
            seen = seen || blocks[a] == e;
        }
        if (seen) {
            continue;
        }
        int i = n++;
        while (i > 0 && blocks[i - 1] > e) {
            blocks[i] = blocks[i - 1];
            --i;
        }
        blocks[i] = e;
    }
    return n;
}

// Sum / max of one value per thread over a 128-thread CTA, the same result in every thread.
// `scratch` holds 4 floats of shared memory; every thread must call.
__device__ inline float cta_sum(float x, float* scratch) {
    for (int off = 16; off > 0; off >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, off);
    }
    if (threadIdx.x % 32 == 0) {
        scratch[threadIdx.x / 32] = x;
    }
    __syncthreads();
    const float r = (scratch[0] + scratch[1]) + (scratch[2] + scratch[3]);
    __syncthreads();
    return r;
}

__device__ inline float cta_max(float x, float* scratch) {
    for (int off = 16; off > 0; off >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    }
    if (threadIdx.x % 32 == 0) {
        scratch[threadIdx.x / 32] = x;
    }
    __syncthreads();
    const float r = fmaxf(fmaxf(scratch[0], scratch[1]), fmaxf(scratch[2], scratch[3]));
    __syncthreads();
    return r;
}

// The document that stores physical block pb, and the block's index in it. K rows of a
// document are contiguous and documents are stored in batch order, so the document of the
// block's first row is the last document head (fragment_first[b] == b) starting at or before
// it. Returns false for padding blocks (no stored keys).
struct KeyBlock {
    int start;  // packed K row of the block's key 0
    int count;  // keys stored
    int doc;    // batch index of the document's first fragment
    int e;      // document-local block index
};

__device__ inline bool key_block_of(const MsaVarlen& v, int pb, KeyBlock* out) {
    const int start = v.block_key_start[pb];
    const int count = v.block_key_count[pb];
    if (start < 0 || count <= 0) {
        return false;
    }
    int doc = -1;
    for (int b = 0; b < v.batch; ++b) {
        if (v.fragment_first[b] == b && v.cu_seqlens_k[b] <= start) {
            doc = b;
        }
    }
    if (doc < 0) {
        return false;
    }
    out->start = start;
    out->count = count < kBlock ? count : kBlock;
    out->doc = doc;
    out->e = (start - v.cu_seqlens_k[doc]) / kBlock;
    return true;
}

// Whether topk[g, t, :] lists block e.
__device__ __forceinline__ bool lists(const int32_t* topk, int total_q, int t, int g, int e) {
    const int32_t* row = topk + (size_t(g) * total_q + t) * kTopK;
    bool hit = false;
    for (int s = 0; s < kTopK; ++s) {
        hit = hit || row[s] == e;
    }
    return hit;
}

// Opt a kernel into `bytes` of dynamic shared memory (above the default 48 KB).
template <typename Kernel>
inline cudaError_t allow_shared(Kernel kernel, size_t bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

// Dynamic shared memory of a key-block CTA: two [128, kRowPad] bf16 tiles.
constexpr size_t kKeyTileBytes = size_t(2) * kBlock * kRowPad * sizeof(uint16_t);

// Copy rows start..start+count of one head of a [rows, heads, 128] bf16 tensor into a
// [128, kRowPad] shared tile (zeros past count). All 128 threads call.
__device__ inline void load_key_tile(uint16_t* tile, const uint16_t* src, int heads, int head,
                                     int start, int count) {
    for (int idx = threadIdx.x; idx < kBlock * kDim; idx += kThreads) {
        const int r = idx / kDim;
        const int d = idx % kDim;
        tile[r * kRowPad + d] =
            r < count ? src[(size_t(start + r) * heads + head) * kDim + d] : uint16_t(0);
    }
}

}  // namespace msa_reference
