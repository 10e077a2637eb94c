// Naive fp32 reference of the sparse attention forward and backward (msa/reference.h): a test
// oracle written for clarity, one CTA per (query, head) row or per (key block, group, 32 dims),
// straight from the definition of docs/contract.md §2. See reference_common.cuh.
#include "msa/reference.h"

#include "reference/reference_common.cuh"

namespace msa_reference {
namespace {

// Packed K/V row of key slot i of a query's selected blocks (`blocks`, ascending).
__device__ __forceinline__ int key_of(const int* blocks, int i) {
    return blocks[i / kBlock] * kBlock + i % kBlock;
}

// scale <q_row, x[row, g]> with q_row an fp32 row in shared memory.
__device__ __forceinline__ float dot_row(const float* q_row, const uint16_t* x, int row, int g) {
    const uint16_t* xr = x + (size_t(row) * kGroups + g) * kDim;
    float acc = 0.0f;
    for (int d = 0; d < kDim; ++d) {
        acc += q_row[d] * bf(xr[d]);
    }
    return acc;
}

// Grid (T, 64): out[t, h, :] and lse[t, h]. Thread d owns output dim d; scores of the token set
// (at most 16 blocks x 128 keys) are computed one key per thread, then normalized.
__global__ void __launch_bounds__(kThreads)
forward_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* topk,
               MsaVarlen vl, float* out, float* lse) {
    __shared__ float s_q[kDim];
    __shared__ float s_p[kMaxKeys];
    __shared__ int s_blocks[kTopK];
    __shared__ int s_nblocks;
    __shared__ float s_red[4];
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    const int g = h / kHeadsPerGroup;
    const int tid = threadIdx.x;
    const Query c = query_of(vl, t);
    if (tid == 0) {
        s_nblocks = selected_blocks(topk, vl.total_q, t, g, c.pos, s_blocks);
    }
    s_q[tid] = bf(q[(size_t(t) * kHeads + h) * kDim + tid]);
    __syncthreads();

    const int n = s_nblocks * kBlock;
    float m = -INFINITY;
    for (int i = tid; i < n; i += kThreads) {
        const int j = key_of(s_blocks, i);
        float s = -INFINITY;
        if (j <= c.pos) {
            s = kScale * dot_row(s_q, k, c.k_base + j, g);
        }
        s_p[i] = s;
        m = fmaxf(m, s);
    }
    m = cta_max(m, s_red);
    float l = 0.0f;
    for (int i = tid; i < n; i += kThreads) {
        const float p = s_p[i] == -INFINITY ? 0.0f : expf(s_p[i] - m);
        s_p[i] = p;
        l += p;
    }
    l = cta_sum(l, s_red);  // also publishes s_p

    float o = 0.0f;
    if (l > 0.0f) {
        for (int i = 0; i < n; ++i) {
            const float p = s_p[i];
            if (p != 0.0f) {
                const int j = key_of(s_blocks, i);
                o += p * bf(v[(size_t(c.k_base + j) * kGroups + g) * kDim + tid]);
            }
        }
        o /= l;
    }
    out[(size_t(t) * kHeads + h) * kDim + tid] = o;
    if (tid == 0) {
        lse[size_t(t) * kHeads + h] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

// Grid (T, 64): delta[t, h] = sum_d dout out (bf16 out, as the kernels take it) and
// dq[t, h, :] = scale sum_j P_j (dP_j - delta) k_j with P_j = exp(s_j - lse), dP_j = dout . v_j.
__global__ void __launch_bounds__(kThreads)
dq_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* topk,
          const uint16_t* dout, const uint16_t* out, const float* lse, MsaVarlen vl, float* delta,
          float* dq) {
    __shared__ float s_q[kDim];
    __shared__ float s_do[kDim];
    __shared__ float s_ds[kMaxKeys];
    __shared__ int s_blocks[kTopK];
    __shared__ int s_nblocks;
    __shared__ float s_red[4];
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    const int g = h / kHeadsPerGroup;
    const int tid = threadIdx.x;
    const size_t row = (size_t(t) * kHeads + h) * kDim;
    const Query c = query_of(vl, t);
    if (tid == 0) {
        s_nblocks = selected_blocks(topk, vl.total_q, t, g, c.pos, s_blocks);
    }
    s_q[tid] = bf(q[row + tid]);
    s_do[tid] = bf(dout[row + tid]);
    const float dl = cta_sum(s_do[tid] * bf(out[row + tid]), s_red);  // also publishes s_*
    if (tid == 0) {
        delta[size_t(t) * kHeads + h] = dl;
    }
    const float L = lse[size_t(t) * kHeads + h];

    const int n = s_nblocks * kBlock;
    for (int i = tid; i < n; i += kThreads) {
        const int j = key_of(s_blocks, i);
        float ds = 0.0f;
        if (j <= c.pos && L != -INFINITY) {
            const float p = expf(kScale * dot_row(s_q, k, c.k_base + j, g) - L);
            ds = p * (dot_row(s_do, v, c.k_base + j, g) - dl);
        }
        s_ds[i] = ds;
    }
    __syncthreads();
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ds = s_ds[i];
        if (ds != 0.0f) {
            const int j = key_of(s_blocks, i);
            acc += ds * bf(k[(size_t(c.k_base + j) * kGroups + g) * kDim + tid]);
        }
    }
    dq[row + tid] = kScale * acc;
}

// Grid (P, 4 groups, 128 / 32): dK and dV of the keys of physical block blockIdx.x, group
// blockIdx.y, dims [32 z, 32 z + 32). Thread i owns key i of the block. The queries that attend
// to the block are found by scanning the document's fragments 128 queries at a time; for each,
// every head of the group adds its dS q and P dout. The block's K and V sit in shared memory.
__global__ void __launch_bounds__(kThreads)
dkdv_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* topk,
            const uint16_t* dout, const float* lse, const float* delta, MsaVarlen vl, float* dk,
            float* dv) {
    extern __shared__ uint16_t s_tiles[];
    uint16_t* s_k = s_tiles;
    uint16_t* s_v = s_tiles + kBlock * kRowPad;
    __shared__ float s_q[kDim];
    __shared__ float s_do[kDim];
    __shared__ int s_attends[kThreads];
    const int g = blockIdx.y;
    const int d0 = blockIdx.z * kDimsPerCta;
    const int tid = threadIdx.x;
    KeyBlock kb;
    if (!key_block_of(vl, blockIdx.x, &kb)) {
        return;  // a padding block: its (zeroed) rows belong to no document
    }
    load_key_tile(s_k, k, kGroups, g, kb.start, kb.count);
    load_key_tile(s_v, v, kGroups, g, kb.start, kb.count);
    const int doc_base = vl.cu_seqlens_k[kb.doc];
    const int j = kb.e * kBlock + tid;  // this thread's document-local key
    float dk_acc[kDimsPerCta];
    float dv_acc[kDimsPerCta];
    for (int d = 0; d < kDimsPerCta; ++d) {
        dk_acc[d] = 0.0f;
        dv_acc[d] = 0.0f;
    }

    for (int b = 0; b < vl.batch; ++b) {
        if (vl.fragment_first[b] != kb.doc) {
            continue;
        }
        const int q_start = vl.cu_seqlens_q[b];
        const int q_len = vl.cu_seqlens_q[b + 1] - q_start;
        const int k_len = vl.cu_seqlens_k[b + 1] - doc_base;
        for (int c0 = 0; c0 < q_len; c0 += kThreads) {
            __syncthreads();  // the previous chunk's flags are consumed
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
                for (int hh = 0; hh < kHeadsPerGroup; ++hh) {
                    const int h = g * kHeadsPerGroup + hh;
                    const size_t row = (size_t(t) * kHeads + h) * kDim;
                    __syncthreads();  // the previous head's rows are consumed
                    s_q[tid] = bf(q[row + tid]);
                    s_do[tid] = bf(dout[row + tid]);
                    __syncthreads();
                    const float L = lse[size_t(t) * kHeads + h];
                    if (tid < kb.count && j <= pos && L != -INFINITY) {
                        float s = 0.0f;
                        float dp = 0.0f;
                        for (int d = 0; d < kDim; ++d) {
                            s += s_q[d] * bf(s_k[tid * kRowPad + d]);
                            dp += s_do[d] * bf(s_v[tid * kRowPad + d]);
                        }
                        const float p = expf(kScale * s - L);
                        const float ds = p * (dp - delta[size_t(t) * kHeads + h]);
                        for (int d = 0; d < kDimsPerCta; ++d) {
                            dk_acc[d] += ds * s_q[d0 + d];
                            dv_acc[d] += p * s_do[d0 + d];
                        }
                    }
                }
            }
        }
    }
    if (tid < kb.count) {
        const size_t at = (size_t(kb.start + tid) * kGroups + g) * kDim + d0;
        for (int d = 0; d < kDimsPerCta; ++d) {
            dk[at + d] = kScale * dk_acc[d];
            dv[at + d] = dv_acc[d];
        }
    }
}

}  // namespace
}  // namespace msa_reference

using namespace msa_reference;

extern "C" int msa_reference_attention_forward(const uint16_t* q, const uint16_t* k,
                                               const uint16_t* v, const int32_t* topk,
                                               MsaVarlen varlen, float* out, float* lse,
                                               void* stream) {
    if (varlen.total_q < 0) {
        return cudaErrorInvalidValue;
    }
    if (varlen.total_q == 0) {
        return cudaSuccess;
    }
    const dim3 grid(unsigned(varlen.total_q), kHeads);
    forward_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(q, k, v, topk, varlen,
                                                                             out, lse);
    return cudaGetLastError();
}

extern "C" int msa_reference_attention_backward(const uint16_t* q, const uint16_t* k,
                                                const uint16_t* v, const int32_t* topk,
                                                const uint16_t* dout, const uint16_t* out,
                                                const float* lse, MsaVarlen varlen, float* delta,
                                                float* dq, float* dk, float* dv, void* stream) {
    if (varlen.total_q < 0 || varlen.total_k < 0 || varlen.padded_kv_blocks < 0) {
        return cudaErrorInvalidValue;
    }
    const auto s = static_cast<cudaStream_t>(stream);
    const size_t kv_bytes = size_t(varlen.total_k) * kGroups * kDim * sizeof(float);
    cudaError_t err = cudaMemsetAsync(dk, 0, kv_bytes, s);
    if (err == cudaSuccess) {
        err = cudaMemsetAsync(dv, 0, kv_bytes, s);
    }
    if (err != cudaSuccess || varlen.total_q == 0) {
        return err;
    }
    dq_kernel<<<dim3(unsigned(varlen.total_q), kHeads), kThreads, 0, s>>>(q, k, v, topk, dout, out,
                                                                         lse, varlen, delta, dq);
    if ((err = cudaGetLastError()) != cudaSuccess || varlen.padded_kv_blocks == 0) {
        return err;
    }
    if ((err = allow_shared(dkdv_kernel, kKeyTileBytes)) != cudaSuccess) {
        return err;
    }
    const dim3 grid(unsigned(varlen.padded_kv_blocks), kGroups, kDim / kDimsPerCta);
    dkdv_kernel<<<grid, kThreads, kKeyTileBytes, s>>>(q, k, v, topk, dout, lse, delta, varlen, dk,
                                                       dv);
    return cudaGetLastError();
}
