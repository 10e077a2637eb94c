/* Lightning indexer forward (docs/contract.md §3.1). For index head g and query t at document
 * position p: s_j = <qi[t, g], ki[k_base + j]> * 128^-0.5 for keys 0 <= j <= p; block score
 * B_b = max of s over the visible keys of document-local block b <= p / 128. The selection is
 * the top min(15, p / 128) non-local blocks by (score desc, id asc) in that order, then the local
 * block p / 128, then -1; the LSE is logsumexp of s over the selected visible keys (natural log).
 *
 * Layouts (contiguous, row-major; bf16 as uint16_t bits): qi [T, 4, 128], ki [Tk, 1, 128],
 * topk [4, T, 16] i32, lse [4, T] f32. T = varlen.total_q, Tk = varlen.total_k. Every pointer
 * must be 16-byte aligned. Deterministic (no atomics): repeated calls are bitwise equal. Each
 * launcher returns a cudaError_t code (0 = success), enqueues on `stream` (a cudaStream_t,
 * NULL = legacy default) and never synchronizes. The forward dispatches on the current device's
 * SM version; its one path today is the sm_80 one (mma.sync), which also runs on sm_90a. */
#ifndef MSA_INDEXER_H
#define MSA_INDEXER_H

#include <stddef.h>
#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace bytes msa_indexer_forward needs (host arithmetic on the size fields of varlen; no
 * CUDA call): block maxima and block sums [4, T, max_blocks] f32 each, plus a tile table of
 * (T + 63 * batch) / 64 i32, each part 256-byte aligned. Writes *bytes; returns a cudaError_t
 * code (cudaErrorInvalidValue for negative sizes). */
int msa_indexer_workspace_bytes(MsaVarlen varlen, size_t* bytes);

/* Parameters of msa_indexer_forward (device pointers; shapes above). */
typedef struct MsaIndexerParams {
    const uint16_t* qi; /* [T, 4, 128] */
    const uint16_t* ki; /* [Tk, 1, 128] */
    MsaVarlen varlen;
    int32_t* topk;      /* [4, T, 16], written in full */
    float* lse;         /* [4, T], written in full */
} MsaIndexerParams;

/* topk and lse of every (head, query), written in full. Enqueues three kernels:
 *   tiles  grid 1, 1024 threads: the query tiles (64 consecutive queries of one fragment);
 *   scores grid ((T + 63 * batch) / 64, ceil(max_blocks / 32)), 256 threads, 64 KB dynamic smem:
 *          per (tile, chunk of 32 key blocks) the block max and sum exp(s - max) of every
 *          (head, query, block) by mma.sync, into the workspace;
 *   select grid ceil(4 T / 8), 256 threads: one warp per (head, query), selection and LSE.
 * workspace: workspace_bytes >= msa_indexer_workspace_bytes of device memory, 256-byte aligned;
 * its contents are scratch. Returns cudaErrorInvalidValue if it is too small or params is
 * NULL. */
int msa_indexer_forward(const MsaIndexerParams* params, void* workspace, size_t workspace_bytes,
                        void* stream);

/* The indexer_lse input of msa_kl_backward (docs/contract.md §3.2: the index distribution over the
 * attention's own token sets): lse[g, t] = logsumexp of s_j over {j : j / 128 in topk[g, t, :],
 * j <= p} (natural log, -inf when the set is empty), with s_j as above. topk [4, T, 16] i32 is the
 * attention's selection; entries outside [0, p / 128] are skipped and a repeated entry counts
 * once (msa_ref::indexer::selection_lse). lse [4, T] f32 is written in full. One kernel, grid
 * ceil(4 T / 8), 256 threads: one warp per (head, query). Deterministic; no workspace. */
int msa_indexer_selection_lse(const uint16_t* qi, const uint16_t* ki, const int32_t* topk,
                              MsaVarlen varlen, float* lse, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_INDEXER_H */
