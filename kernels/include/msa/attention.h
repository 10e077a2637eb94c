/* Sparse attention kernels (docs/contract.md §2, §5): forward, atomic backward main kernel, and the
 * two kernels of the deterministic backward. Correct-first mma.sync (sm_80+) implementations; they
 * run on sm_80 and sm_90a alike.
 *
 * Fixed shapes: 64 query heads, 4 KV groups (head h reads group h / 16), head_dim 128, key
 * blocks of 128, top-k 16, softmax_scale = 128^-0.5. Layouts (contiguous, row-major; bf16 as
 * uint16_t bits): q, out, dout, dq [T, 64, 128]; k, v, dk, dv [Tk, 4, 128]; topk [4, T, 16] i32
 * (document-local block ids, -1 padding, validated before launch); lse, delta [T, 64] fp32
 * (natural-log LSE). T = varlen.total_q, Tk = varlen.total_k. Every pointer must be 16-byte
 * aligned. Each launcher returns a cudaError_t code (0 = success), enqueues on `stream` (a
 * cudaStream_t, NULL = legacy default) and never synchronizes. */
#ifndef MSA_ATTENTION_H
#define MSA_ATTENTION_H

#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = softmax(scale q k^T) v over each query's selected visible keys; lse = its logsumexp.
 * Empty selection: out = 0, lse = -inf. Deterministic.
 * Grid (ceil(T / 8), 4), 256 threads, ~131 KB dynamic smem. */
int msa_attn_forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* topk,
                     MsaVarlen varlen, uint16_t* out, float* lse, void* stream);

/* Backward main kernel, KV-outer over the device task tables (NeMo's structure): accumulates
 *   dq_accum [T, 64, 128] fp32   += dS k          (final dQ: the softmax scale is inside dS),
 *   dk_pool, dv_pool [W, 4, 128] fp32 += dS^T q, P^T dout  at workspace row kblock * 128 + r,
 * with unordered fp32 atomics, so all three must be zeroed (or hold partial sums) beforehand.
 * delta = rowsum(dout * out) [T, 64] fp32. Task tables: task_meta [cap, 4] = (0, group, physical
 * kblock, valid slots), task_qrows [cap, 8] (packed query or -1), task_qpos [cap, 8] (query
 * position in workspace coordinates), desc [8] = (num_task_rows, rows_per_cta, num_full_ctas,
 * tail_rows, grid_ctas, num_work, num_tasks, flags). W = varlen.padded_kv_blocks * 128.
 * Grid (grid_launch) (nothing is launched for 0), 256 threads, ~130 KB dynamic smem; CTAs past
 * desc.grid_ctas exit at once. */
int msa_attn_backward_main(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                           const float* lse, const float* delta, const int32_t* task_meta,
                           const int32_t* task_qrows, const int32_t* task_qpos, const int32_t* desc,
                           int32_t grid_launch, MsaVarlen varlen, float* dq_accum, float* dk_pool,
                           float* dv_pool, void* stream);

/* Deterministic dQ, query-outer (the forward's structure): dq [T, 64, 128] bf16 written directly,
 * bitwise repeatable. Grid (ceil(T / 8), 4), 256 threads, ~131 KB dynamic smem. */
int msa_attn_backward_dq(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                         const float* lse, const float* delta, const int32_t* topk, MsaVarlen varlen,
                         uint16_t* dq, void* stream);

/* Deterministic dK/dV, physical-block-outer: one CTA per (physical block, group) walks the
 * physical CSR (phys_row_ptr [4, P + 1], phys_q_indices [4, T * 16] packed queries ascending,
 * phys_valid [4, T * 16] = visible_keys | writer_rank << 8; P = varlen.padded_kv_blocks) and
 * writes dk, dv [Tk, 4, 128] bf16 at the block's packed key rows; blocks nobody selected get
 * zeros, padding blocks write nothing. Bitwise repeatable.
 * Grid (P, 4), 256 threads, ~130 KB dynamic smem. */
int msa_attn_backward_dkv(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                          const float* lse, const float* delta, const int32_t* phys_row_ptr,
                          const int32_t* phys_q_indices, const int32_t* phys_valid, MsaVarlen varlen,
                          uint16_t* dk, uint16_t* dv, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_ATTENTION_H */
