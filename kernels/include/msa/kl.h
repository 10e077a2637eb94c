/* KL backward of the index branch (docs/contract.md §3.2). For query q at document position p and
 * group g, S(q, g) = (selected blocks of topk[g, q]) ∩ {j <= p}; on S:
 *   teacher t(j) = (1/16) sum_{h in group g} exp(scale <q[q, h], k[j, g]> - teacher_lse[q, h]),
 *   student s(j) = exp(iscale <qi[q, g], ki[j]> - indexer_lse[g, q]),
 *   dz(j) = bf16(s(j) - t(j)) (round to nearest even),
 *   dqi[q, g] = grad_scale sum_j dz(j) ki[j],  dki[j] = grad_scale sum_{(q, g): j in S} dz(j) qi[q, g],
 * with scale = iscale = 128^-0.5 and grad_scale = iscale * loss_coeff / (4 * max(T, 1)).
 *
 * Layouts (contiguous, row-major; bf16 as uint16_t bits): q [T, 64, 128], k [Tk, 4, 128],
 * teacher_lse [T, 64] f32 (the attention forward's natural-log LSE), qi, dqi [T, 4, 128],
 * ki, dki [Tk, 1, 128], indexer_lse [4, T] f32, topk [4, T, 16] i32 (validated), and the
 * physical CSR of prepare for that same topk: phys_row_ptr [4, P + 1], phys_q_indices
 * [4, T * 16] (packed queries, ascending per block), phys_valid [4, T * 16]
 * (visible_keys | writer_rank << 8); P = varlen.padded_kv_blocks. Every pointer must be 16-byte
 * aligned. Deterministic (no atomics): repeated calls are bitwise equal. Each launcher returns a
 * cudaError_t code (0 = success), enqueues on `stream` and never synchronizes. The backward
 * dispatches on the current device's SM version; its one path today is the sm_80 one (mma.sync),
 * which also runs on sm_90a. */
#ifndef MSA_KL_H
#define MSA_KL_H

#include <stddef.h>
#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace bytes msa_kl_backward needs (host arithmetic on the size fields of varlen; no CUDA
 * call), with cap = P + ceil(64 T / 512) work items: per-(group, query, selection slot) dQI
 * partials [4, T, 16, 128] f32, per-item dKI partials [cap, 128, 128] f32, the item table
 * [cap, 4] i32 and per-block item ranges [P, 2] i32, each part 256-byte aligned. Writes *bytes;
 * returns a cudaError_t code (cudaErrorInvalidValue for negative sizes). */
int msa_kl_workspace_bytes(MsaVarlen varlen, size_t* bytes);

/* Parameters of msa_kl_backward (device pointers; shapes above). */
typedef struct MsaKlParams {
    const uint16_t* q;            /* [T, 64, 128], the attention's q */
    const uint16_t* k;            /* [Tk, 4, 128], the attention's k */
    const float* teacher_lse;     /* [T, 64], the attention forward's LSE */
    const uint16_t* qi;           /* [T, 4, 128] */
    const uint16_t* ki;           /* [Tk, 1, 128] */
    const float* indexer_lse;     /* [4, T] */
    const int32_t* topk;          /* [4, T, 16], validated */
    const int32_t* phys_row_ptr;  /* [4, P + 1]: prepare's physical CSR of topk */
    const int32_t* phys_q_indices; /* [4, T * 16] */
    const int32_t* phys_valid;    /* [4, T * 16] */
    MsaVarlen varlen;
    float loss_coeff;             /* grad_scale = iscale * loss_coeff / (4 * max(T, 1)) */
    uint16_t* dqi;                /* [T, 4, 128], written in full */
    uint16_t* dki;                /* [Tk, 1, 128], written in full */
} MsaKlParams;

/* dqi and dki, every element written (keys in no token set and queries without a selection get
 * exact zeros). KV-outer: the teacher is computed once per (query, group, selected block), so
 * the work is balanced however the selection is spread. Enqueues four kernels:
 *   items  grid 1, 1024 threads: work items of at most 512 (query, group) pairs of one
 *          physical block (its 4 groups' CSR rows concatenated), per-block item ranges;
 *   main   grid (cap), 256 threads, ~145 KB dynamic smem: per item, tiles of 8 pairs: teacher
 *          (16 heads x 128 keys by mma), student scores and dz, the pairs' dQI partials (written
 *          to the slot of the block's writer rank) and the item's dKI (written in bf16 when the
 *          block has one item, else as an f32 partial);
 *   dqi    grid ceil(4 T / 8), 256 threads: dqi = grad_scale * sum of the query's slot partials
 *          in slot order (the number of slots: topk entries 0 <= e < num_blocks);
 *   dki    grid (P), 256 threads: blocks with several items sum their partials in item order,
 *          blocks nobody selected write zeros.
 * workspace: workspace_bytes >= msa_kl_workspace_bytes of device memory, 256-byte aligned; its
 * contents are scratch. Returns cudaErrorInvalidValue if it is too small or params is NULL. */
int msa_kl_backward(const MsaKlParams* params, void* workspace, size_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_KL_H */
