// Naive fp32 reference of the KL backward of the index branch (msa/reference.h): a test oracle
// written for clarity from docs/contract.md §3.2, one CTA per (query, index head) for dQI and
// one per (key block, 32 dims) for dKI. See reference_common.cuh.
#include "msa/reference.h"

#include "reference/reference_common.cuh"

namespace msa_reference {
namespace {

// <a, x> for an fp32 row a in shared memory and a bf16 row x.
__device__ __forceinline__ float dot_bf16(const float* a, const uint16_t* x) {
    float acc = 0.0f;
    for (int d = 0; d < kDim; ++d) {
        acc += a[d] * bf(x[d]);
    }
    return acc;
}

// dz of one key for one (query, group): bf16(student - teacher), the teacher being the mean of
// the group's 16 head probabilities. `s_q` holds the 16 query rows, `s_tl` their teacher LSEs,
// `s_qi` the index query and `il` its LSE; `k_row` / `ki_row` are the key's 128-element rows
// (in global or shared memory).
__device__ __forceinline__ float dz_of(const float (*s_q)[kDim], const float* s_tl,
                                       const float* s_qi, float il, const uint16_t* k_row,
                                       const uint16_t* ki_row) {
    float teacher = 0.0f;
    for (int hh = 0; hh < kHeadsPerGroup; ++hh) {
        if (s_tl[hh] != -INFINITY) {
            teacher += expf(kScale * dot_bf16(s_q[hh], k_row) - s_tl[hh]);
        }
    }
    teacher /= float(kHeadsPerGroup);
    const float student = il == -INFINITY ? 0.0f : expf(kScale * dot_bf16(s_qi, ki_row) - il);
    return round_bf16(student - teacher);
}

// Grid (T, 4): dqi[t, g, :] = grad_scale sum_{j in S} dz_j ki[j]. Thread d owns dim d; the dz of
// the token set are computed one key per thread.
__global__ void __launch_bounds__(kThreads)
dqi_kernel(const uint16_t* q, const uint16_t* k, const float* teacher_lse, const uint16_t* qi,
           const uint16_t* ki, const float* indexer_lse, const int32_t* topk, MsaVarlen vl,
           float grad_scale, float* dqi) {
    __shared__ float s_q[kHeadsPerGroup][kDim];
    __shared__ float s_qi[kDim];
    __shared__ float s_tl[kHeadsPerGroup];
    __shared__ float s_dz[kMaxKeys];
    __shared__ int s_blocks[kTopK];
    __shared__ int s_nblocks;
    const int t = blockIdx.x;
    const int g = blockIdx.y;
    const int tid = threadIdx.x;
    const Query c = query_of(vl, t);
    if (tid == 0) {
        s_nblocks = selected_blocks(topk, vl.total_q, t, g, c.pos, s_blocks);
    }
    for (int hh = 0; hh < kHeadsPerGroup; ++hh) {
        const int h = g * kHeadsPerGroup + hh;
        s_q[hh][tid] = bf(q[(size_t(t) * kHeads + h) * kDim + tid]);
    }
    s_qi[tid] = bf(qi[(size_t(t) * kGroups + g) * kDim + tid]);
    if (tid < kHeadsPerGroup) {
        s_tl[tid] = teacher_lse[size_t(t) * kHeads + g * kHeadsPerGroup + tid];
    }
    const float il = indexer_lse[size_t(g) * vl.total_q + t];
    __syncthreads();

    const int n = s_nblocks * kBlock;
    for (int i = tid; i < n; i += kThreads) {
        const int j = s_blocks[i / kBlock] * kBlock + i % kBlock;
        float dz = 0.0f;
        if (j <= c.pos) {
            const int r = c.k_base + j;
            dz = dz_of(s_q, s_tl, s_qi, il, k + (size_t(r) * kGroups + g) * kDim,
                       ki + size_t(r) * kDim);
        }
        s_dz[i] = dz;
    }
    __syncthreads();
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float dz = s_dz[i];
        if (dz != 0.0f) {
            const int j = s_blocks[i / kBlock] * kBlock + i % kBlock;
            acc += dz * bf(ki[size_t(c.k_base + j) * kDim + tid]);
        }
    }
    dqi[(size_t(t) * kGroups + g) * kDim + tid] = grad_scale * acc;
}

// Grid (P, 128 / 32): dki of the keys of physical block blockIdx.x, dims [32 y, 32 y + 32),
// summed over the 4 index heads and every query whose token set holds the key. Thread i owns key
// i of the block; the block's K (of the current group) and KI sit in shared memory.
__global__ void __launch_bounds__(kThreads)
dki_kernel(const uint16_t* q, const uint16_t* k, const float* teacher_lse, const uint16_t* qi,
           const uint16_t* ki, const float* indexer_lse, const int32_t* topk, MsaVarlen vl,
           float grad_scale, float* dki) {
    extern __shared__ uint16_t s_tiles[];
    uint16_t* s_k = s_tiles;
    uint16_t* s_ki = s_tiles + kBlock * kRowPad;
    __shared__ float s_q[kHeadsPerGroup][kDim];
    __shared__ float s_qi[kDim];
    __shared__ float s_tl[kHeadsPerGroup];
    __shared__ int s_attends[kThreads];
    const int d0 = blockIdx.y * kDimsPerCta;
    const int tid = threadIdx.x;
    KeyBlock kb;
    if (!key_block_of(vl, blockIdx.x, &kb)) {
        return;  // a padding block: its (zeroed) rows belong to no document
    }
    load_key_tile(s_ki, ki, 1, 0, kb.start, kb.count);
    const int doc_base = vl.cu_seqlens_k[kb.doc];
    const int j = kb.e * kBlock + tid;
    float acc[kDimsPerCta];
    for (int d = 0; d < kDimsPerCta; ++d) {
        acc[d] = 0.0f;
    }

    for (int g = 0; g < kGroups; ++g) {
        __syncthreads();  // the previous group's tile is consumed
        load_key_tile(s_k, k, kGroups, g, kb.start, kb.count);
        for (int b = 0; b < vl.batch; ++b) {
            if (vl.fragment_first[b] != kb.doc) {
                continue;
            }
            const int q_start = vl.cu_seqlens_q[b];
            const int q_len = vl.cu_seqlens_q[b + 1] - q_start;
            const int k_len = vl.cu_seqlens_k[b + 1] - doc_base;
            for (int c0 = 0; c0 < q_len; c0 += kThreads) {
                __syncthreads();
                const int i = c0 + tid;
                bool attends = false;
                if (i < q_len) {
                    const int pos = k_len - q_len + i;
                    attends = pos >= kb.e * kBlock && lists(topk, vl.total_q, q_start + i, g, kb.e);
                }
                s_attends[tid] = attends;
                __syncthreads();
                for (int a = 0; a < kThreads && c0 + a < q_len; ++a) {
                    if (!s_attends[a]) {
                        continue;
                    }
                    const int t = q_start + c0 + a;
                    const int pos = k_len - q_len + c0 + a;
                    __syncthreads();  // the previous query's rows are consumed
                    for (int hh = 0; hh < kHeadsPerGroup; ++hh) {
                        const int h = g * kHeadsPerGroup + hh;
                        s_q[hh][tid] = bf(q[(size_t(t) * kHeads + h) * kDim + tid]);
                    }
                    s_qi[tid] = bf(qi[(size_t(t) * kGroups + g) * kDim + tid]);
                    if (tid < kHeadsPerGroup) {
                        s_tl[tid] = teacher_lse[size_t(t) * kHeads + g * kHeadsPerGroup + tid];
                    }
                    __syncthreads();
                    if (tid < kb.count && j <= pos) {
                        const float il = indexer_lse[size_t(g) * vl.total_q + t];
                        const float dz =
                            dz_of(s_q, s_tl, s_qi, il, s_k + tid * kRowPad, s_ki + tid * kRowPad);
                        for (int d = 0; d < kDimsPerCta; ++d) {
                            acc[d] += dz * s_qi[d0 + d];
                        }
                    }
                }
            }
        }
    }
    if (tid < kb.count) {
        const size_t at = size_t(kb.start + tid) * kDim + d0;
        for (int d = 0; d < kDimsPerCta; ++d) {
            dki[at + d] = grad_scale * acc[d];
        }
    }
}

}  // namespace
}  // namespace msa_reference

using namespace msa_reference;

extern "C" int msa_reference_kl_backward(const uint16_t* q, const uint16_t* k,
                                         const float* teacher_lse, const uint16_t* qi,
                                         const uint16_t* ki, const float* indexer_lse,
                                         const int32_t* topk, MsaVarlen varlen, float loss_coeff,
                                         float* dqi, float* dki, void* stream) {
    if (varlen.total_q < 0 || varlen.total_k < 0 || varlen.padded_kv_blocks < 0) {
        return cudaErrorInvalidValue;
    }
    const auto s = static_cast<cudaStream_t>(stream);
    cudaError_t err = cudaMemsetAsync(dki, 0, size_t(varlen.total_k) * kDim * sizeof(float), s);
    if (err != cudaSuccess || varlen.total_q == 0) {
        return err;
    }
    const double t = varlen.total_q > 1 ? double(varlen.total_q) : 1.0;
    const float grad_scale = float(double(kScale) * double(loss_coeff) / (kGroups * t));
    dqi_kernel<<<dim3(unsigned(varlen.total_q), kGroups), kThreads, 0, s>>>(
        q, k, teacher_lse, qi, ki, indexer_lse, topk, varlen, grad_scale, dqi);
    if ((err = cudaGetLastError()) != cudaSuccess || varlen.padded_kv_blocks == 0) {
        return err;
    }
    if ((err = allow_shared(dki_kernel, kKeyTileBytes)) != cudaSuccess) {
        return err;
    }
    const dim3 grid(unsigned(varlen.padded_kv_blocks), kDim / kDimsPerCta);
    dki_kernel<<<grid, kThreads, kKeyTileBytes, s>>>(q, k, teacher_lse, qi, ki, indexer_lse, topk,
                                                      varlen, grad_scale, dki);
    return cudaGetLastError();
}
