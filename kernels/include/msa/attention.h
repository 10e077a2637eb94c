/* Sparse attention kernels (docs/contract.md §2, §5): the forward, the atomic backward main kernel, the two
 * kernels of the deterministic backward, the backward's pre- and postprocess, and the sm_90a
 * backward. The forward dispatches on the current device's SM version (read once per device):
 * on compute capability 9.0 the warp-specialized wgmma/TMA kernel (attention/forward_sm90.cuh)
 * over tile unions, elsewhere the mma.sync kernel (sm_80+). The backward has two entry points:
 * msa_attn_backward_sm90 (KV-outer wgmma/TMA, compute capability 9.0 only) and the mma.sync
 * kernels below it (every device; the deterministic pair on every device).
 *
 * Fixed shapes: 64 query heads, 4 KV groups (head h reads group h / 16), head_dim 128, key
 * blocks of 128, top-k 16, softmax_scale = 128^-0.5 (msa/abi.h). Layouts (contiguous, row-major;
 * bf16 as uint16_t bits): q, out, dout, dq [T, 64, 128]; k, v, dk, dv [Tk, 4, 128]; topk
 * [4, T, 16] i32 (document-local block ids, -1 padding, validated before launch); lse, delta
 * [T, 64] fp32 (natural-log LSE). T = varlen.total_q, Tk = varlen.total_k. Every pointer must be
 * 16-byte aligned. The forward and backward kernels take a parameter struct (a NULL params is
 * cudaErrorInvalidValue). Each launcher returns a cudaError_t code (0 = success), enqueues on
 * `stream` (a cudaStream_t, NULL = legacy default) and never synchronizes. */
#ifndef MSA_ATTENTION_H
#define MSA_ATTENTION_H

#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parameters of msa_attn_forward (device pointers). */
typedef struct MsaAttnFwdParams {
    const uint16_t* q;    /* [T, 64, 128] */
    const uint16_t* k;    /* [Tk, 4, 128] */
    const uint16_t* v;    /* [Tk, 4, 128] */
    const int32_t* topk;  /* [4, T, 16], validated */
    MsaVarlen varlen;
    uint16_t* out;        /* [T, 64, 128], written in full */
    float* lse;           /* [T, 64], written in full */
    void* workspace;      /* msa_attn_forward_workspace_bytes of scratch, 256-byte aligned */
    size_t workspace_bytes;
    int32_t force_sm80;   /* nonzero: the mma.sync kernel on any device (the reference path) */
} MsaAttnFwdParams;

/* Workspace bytes of msa_attn_forward for T = varlen.total_q (host arithmetic, no CUDA call): the
 * sm_90a path's claim counter (256 bytes), its tiles' unions (entries [4, ceil(T / 8), 128] int4,
 * written by the kernel) and its claim order ([4 * ceil(T / 8)] int); the sm_80 path ignores it. */
int msa_attn_forward_workspace_bytes(MsaVarlen varlen, size_t* bytes);

/* out = softmax(scale q k^T) v over each query's selected visible keys; lse = its logsumexp.
 * Empty selection: out = 0, lse = -inf. Deterministic. Tiles of 8 consecutive packed queries
 * of one group. sm_90a: a memset of the claim counter (where fragments are short, a one-CTA
 * kernel that also writes the claim order), then one persistent CTA per SM (384 threads, 227 KB
 * dynamic smem) that builds each tile's union itself and claims tiles in natural order, the short
 * layouts' first-block tiles last (attention/forward_sm90.cuh). sm_80: grid (ceil(T / 8), 4),
 * 256 threads, ~131 KB dynamic smem. cudaErrorInvalidValue if the workspace is too small. */
int msa_attn_forward(const MsaAttnFwdParams* params, void* stream);

/* Parameters of the backward launchers (device pointers), one struct for the three kernels
 * (FA3's Flash_bwd_params): each launcher reads the inputs and the fields of its own section;
 * the others may stay null. */
typedef struct MsaAttnBwdParams {
    /* Inputs of every backward kernel. */
    const uint16_t* q;     /* [T, 64, 128] */
    const uint16_t* k;     /* [Tk, 4, 128] */
    const uint16_t* v;     /* [Tk, 4, 128] */
    const uint16_t* dout;  /* [T, 64, 128] */
    const float* lse;      /* [T, 64], the forward's natural-log LSE */
    const float* delta;    /* [T, 64], rowsum(dout * out) */
    const float* dout_norm; /* [T, 64], |dout| per row: msa_attn_backward_sm90_det only
                             * (msa_attn_backward_preprocess_norm) */
    MsaVarlen varlen;

    /* msa_attn_backward_main: the device task tables and the fp32 accumulators. */
    const int32_t* task_meta;  /* [cap, 4] = (0, group, physical kblock, valid slots) */
    const int32_t* task_qrows; /* [cap, 8]: packed query or -1 */
    const int32_t* task_qpos;  /* [cap, 8]: query position in workspace coordinates */
    const int32_t* desc;       /* [8]: the CTA-walk descriptor (MSA_DESC_*) */
    int32_t grid_launch;       /* CTAs to launch (host-side bound); 0 launches nothing */
    float* dq_accum;           /* [T, 64, 128] */
    float* dk_pool;            /* [W, 4, 128] */
    float* dv_pool;            /* [W, 4, 128] */

    /* msa_attn_backward_dq: the validated selection and the bf16 dQ. */
    const int32_t* topk; /* [4, T, 16] */
    uint16_t* dq;        /* [T, 64, 128] */

    /* msa_attn_backward_dkv: prepare's physical CSR and the bf16 dK, dV. */
    const int32_t* phys_row_ptr;   /* [4, P + 1] */
    const int32_t* phys_q_indices; /* [4, T * 16]: packed queries, ascending per block */
    const int32_t* phys_valid;     /* [4, T * 16]: visible_keys | writer_rank << 8 */
    uint16_t* dk;                  /* [Tk, 4, 128] */
    uint16_t* dv;                  /* [Tk, 4, 128] */
    /* msa_attn_backward_sm90: the physical CSR, dq, dk, dv above, and its scratch. */
    void* workspace;               /* msa_attn_backward_sm90_workspace_bytes, 256-byte aligned */
    size_t workspace_bytes;
} MsaAttnBwdParams;
/* Workspace bytes of msa_attn_backward_sm90 (host arithmetic): dq_accum [T, 4, 2048] f32 (in the
 * main kernel's fragment order, attention/dq_fragments.cuh), the work items, their rows by id
 * [4 P + ceil(64 T / 512)] int4 each, the band scratch [the same] i32,
 * split slots and split parts [4, P] i32 each, counts [12] i32 and the dK/dV accumulators of split
 * rows [floor(64 T / 513), 2, 128, 128] f32, each 256-byte aligned (P = varlen.padded_kv_blocks). */
int msa_attn_backward_sm90_workspace_bytes(MsaVarlen varlen, size_t* bytes);
/* dq, dk, dv (bf16, written in full; keys nobody selected get exact zeros) on compute capability
 * 9.0 (cudaErrorNotSupported elsewhere): KV-outer over prepare's physical CSR
 * (attention/backward_sm90.cuh; the softmax scale rides on dS as in the sm_80 kernels). Enqueues:
 * the item build (1 CTA: each (group, block) row cut into items of <= 512 CSR
 * entries, msa_plan::backward::kv_items); zero the slots of split rows; the main kernel (one
 * persistent CTA per SM, 384 threads, 217 KB dynamic smem; dQ by fp32 bulk reduce-adds into an
 * accumulator one of its warps zeroes group by group ahead of them, so not bitwise repeatable; two
 * of its warps zero the dK/dV rows nobody selected); the epilogue (one
 * launch of 256 threads: the dK/dV finisher, two (block, group) rows a CTA, and the dQ cast). Reads q, k, v, dout, lse,
 * delta, varlen, phys_row_ptr, phys_q_indices, phys_valid. */
int msa_attn_backward_sm90(const MsaAttnBwdParams* params, void* stream);
/* Workspace bytes of msa_attn_backward_sm90_det: those of msa_attn_backward_sm90 with the dK/dV
 * accumulators as parts, one per item of a split row [floor(64 T / 256), 2, 128, 128] f32 (twice
 * the slots), then block bounds [4, P, 2] f32 and the dQ grid [T, 64] f32. */
int msa_attn_backward_sm90_det_workspace_bytes(MsaVarlen varlen, size_t* bytes);
/* msa_attn_backward_sm90 in deterministic mode: dq, dk, dv bitwise repeatable (same inputs, same
 * device, same number of SMs). Also reads topk and dout_norm. After the item build it builds each dQ
 * row's grid (attention/backward_det_grid.cuh: |K|, |V| bounds per block, then per row from
 * dout_norm, delta and the selected blocks); the main kernel (the same one, kDet) rounds each dQ
 * contribution to its row's grid, so the fp32 reduce-adds are exact in any order, and stores each
 * item of a split row's dK/dV in a part of its own; the epilogue sums a row's parts in id order.
 * No slot zeroing, no wait between CTAs.
 * Graph-capturable, no host synchronization. */
int msa_attn_backward_sm90_det(const MsaAttnBwdParams* params, void* stream);

/* Backward main kernel, KV-outer over the device task tables (NeMo's structure): accumulates
 *   dq_accum [T, 64, 128] fp32   += dS k          (final dQ: the softmax scale is inside dS),
 *   dk_pool, dv_pool [W, 4, 128] fp32 += dS^T q, P^T dout  at workspace row kblock * 128 + r,
 * with unordered fp32 atomics, so all three must be zeroed (or hold partial sums) beforehand.
 * desc = (num_task_rows, rows_per_cta, num_full_ctas, tail_rows, grid_ctas, num_work,
 * num_tasks, flags). W = varlen.padded_kv_blocks * 128.
 * Grid (grid_launch) (nothing is launched for 0), 256 threads, ~130 KB dynamic smem; CTAs past
 * desc.grid_ctas exit at once. */
int msa_attn_backward_main(const MsaAttnBwdParams* params, void* stream);

/* Deterministic dQ, query-outer (the forward's structure): dq [T, 64, 128] bf16 written directly,
 * bitwise repeatable. Grid (ceil(T / 8), 4), 256 threads, ~131 KB dynamic smem. */
int msa_attn_backward_dq(const MsaAttnBwdParams* params, void* stream);

/* Deterministic dK/dV, physical-block-outer: one CTA per (physical block, group) walks the
 * physical CSR (P = varlen.padded_kv_blocks) and writes dk, dv [Tk, 4, 128] bf16 at the block's
 * packed key rows; blocks nobody selected get zeros, padding blocks write nothing. Bitwise
 * repeatable. Grid (P, 4), 256 threads, ~130 KB dynamic smem. */
int msa_attn_backward_dkv(const MsaAttnBwdParams* params, void* stream);

/* ---- Backward pre- and postprocess (nemo-kernels §5.3, §5.5; docs/design.md "Backward" steps 1
 * and 4). Streaming kernels: dq_accum [T, 64, 128] fp32, dk_pool, dv_pool [W, 4, 128] fp32;
 * every tensor pointer 16-byte aligned (else cudaErrorInvalidValue); nothing is launched for
 * empty tensors. */

/* delta[t, h] = sum_d out[t, h, d] * dout[t, h, d] in fp32 (the products of two bf16 values are
 * exact in fp32; 8 sequential fma per thread, then a 16-lane butterfly), out, dout
 * [T, 64, 128], delta [T, 64]. Deterministic.
 * Grid ceil(T * 64 / 16), 256 threads: 16 threads per (t, h) row, 16-byte loads. */
int msa_attn_backward_preprocess(const uint16_t* out, const uint16_t* dout, int32_t total_q, float* delta,
                                 void* stream);
/* msa_attn_backward_preprocess that also writes dout_norm[t, h] = sqrt(sum_d dout[t, h, d]^2)
 * (fp32, the same pass; the deterministic sm_90a backward's dQ grid reads it). */
int msa_attn_backward_preprocess_norm(const uint16_t* out, const uint16_t* dout, int32_t total_q, float* delta,
                                      float* dout_norm, void* stream);

/* dq = bf16(dq_accum), round to nearest even (__float2bfloat16_rn), element for element.
 * Grid ceil(T * 64 * 128 / 8 / 256), 256 threads: 8 elements per thread. */
int msa_attn_backward_postprocess_dq(const float* dq_accum, int32_t total_q, uint16_t* dq, void* stream);

/* dk, dv = bf16 (round to nearest even) of the workspace pools gathered to packed key rows: for
 * physical block pb, packed row block_key_start[pb] + r takes pool row pb * 128 + r for every
 * r < block_key_count[pb] (every packed key row exactly once; padding blocks are skipped).
 * Grid (ceil(W * 64 / 256), 2): blockIdx.y 0 casts dK, 1 dV; 8 elements per thread. */
int msa_attn_backward_postprocess_dkv(const float* dk_pool, const float* dv_pool, MsaVarlen varlen, uint16_t* dk,
                                      uint16_t* dv, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_ATTENTION_H */
