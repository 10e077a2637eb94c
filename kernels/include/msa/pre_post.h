/* Backward pre/postprocess family (docs/contract.md §5.4; docs/design.md "Backward" steps 1
 * and 4): the delta preprocess and the casts of the fp32 accumulators to the bf16 gradients.
 * Layouts (contiguous, row-major; bf16 as uint16_t bits): out, dout, dq [T, 64, 128];
 * dq_accum [T, 64, 128] fp32; delta [T, 64] fp32; dk_pool, dv_pool [W, 4, 128] fp32 with
 * W = varlen.padded_kv_blocks * 128; dk, dv [Tk, 4, 128]. T = varlen.total_q,
 * Tk = varlen.total_k. Every tensor pointer must be 16-byte aligned. Each launcher enqueues one
 * kernel on stream (nothing for empty tensors), never synchronizes, and returns a cudaError_t
 * code. */
#ifndef MSA_PRE_POST_H
#define MSA_PRE_POST_H

#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* delta[t, h] = sum_d out[t, h, d] * dout[t, h, d] in fp32 (the products of two bf16 values are
 * exact in fp32; 8 sequential fma per thread, then a 16-lane butterfly). Deterministic.
 * Grid ceil(T * 64 / 16), 256 threads: 16 threads per (t, h) row, 16-byte loads. */
int msa_pre_post_delta(const uint16_t* out, const uint16_t* dout, int32_t total_q, float* delta,
                       void* stream);

/* dq = bf16(dq_accum), round to nearest even (__float2bfloat16_rn), element for element.
 * Grid ceil(T * 64 * 128 / 8 / 256), 256 threads: 8 elements per thread. */
int msa_pre_post_dq(const float* dq_accum, int32_t total_q, uint16_t* dq, void* stream);

/* dk, dv = bf16 (round to nearest even) of the workspace pools gathered to packed key rows: for
 * physical block pb, packed row block_key_start[pb] + r takes pool row pb * 128 + r for every
 * r < block_key_count[pb] (every packed key row exactly once; padding blocks are skipped).
 * Grid (ceil(W * 64 / 256), 2): blockIdx.y 0 casts dK, 1 dV; 8 elements per thread. */
int msa_pre_post_dkv(const float* dk_pool, const float* dv_pool, MsaVarlen varlen, uint16_t* dk,
                     uint16_t* dv, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_PRE_POST_H */
