/* Prepare family: the device-built layout arrays of one packed layout (msa_prepare_layout), the
 * device-built metadata of one top-k selection (msa_prepare_metadata; docs/design.md "Device data
 * of one call"; docs/contract.md §4.1-§4.3) and its validation alone (msa_prepare_validate). Each launcher enqueues its whole pipeline on a stream with no
 * host synchronization, so it can be captured in a CUDA graph; every output equals the host
 * planner's table word for word (msa_plan::layout, topk, csr, schedule), which the GPU suite
 * checks.
 *
 * Construction is deterministic: edges are bits of a (head, block) x query bitmap set by atomicOr,
 * every slot is a popcount prefix of that bitmap (rows list their queries in ascending order, as
 * the host's stable scatter), counts are integer sums, and the first fault of the top-k
 * validation is an atomicMax over complemented linear indices. Nothing depends on timing. */
#ifndef MSA_PREPARE_H
#define MSA_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output tensors of msa_prepare_layout (int32): the derived arrays of MsaVarlen. */
typedef struct MsaLayoutOutputs {
    int32_t* fragment_first;  /* [batch]: fragment_indices, or b when absent */
    int32_t* query_fragment;  /* [total_q]: fragment of each packed query (may be NULL when
                                 total_q = 0) */
    int32_t* block_key_start; /* [padded_kv_blocks]: packed K row of the block's key 0, -1 for
                                 padding */
    int32_t* block_key_count; /* [padded_kv_blocks]: keys the document stores in the block (the
                                 longest fragment's), 0 for padding */
} MsaLayoutOutputs;

/* Derives the layout arrays of MsaVarlen from cu_seqlens_q, cu_seqlens_k ([batch + 1] each) and
 * fragment_indices ([batch], or NULL for plain documents) with msa_plan::VarlenLayout's rule
 * (fragment_first, query_fragments, physical_block_keys), word for word. The inputs must form a
 * valid layout (msa_plan::VarlenLayout::new's rules, cu_seqlens_q[batch] = total_q,
 * cu_seqlens_k[batch] = total_k); invalid ones give meaningless arrays but no out-of-bounds
 * access. padded_kv_blocks must be (total_k + (batch + 1) * 128 - 1) / 128 and batch >= 1, else
 * cudaErrorInvalidValue and nothing is enqueued. One kernel (grid-stride, 256 threads, every
 * element written by one thread: deterministic), no host synchronization, graph-capturable.
 * Returns a cudaError_t code. */
int msa_prepare_layout(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                       const int32_t* fragment_indices, int32_t batch, int32_t total_q,
                       int32_t total_k, int32_t padded_kv_blocks, MsaLayoutOutputs out,
                       void* stream);

/* Output tensors of msa_prepare_metadata (int32, row-major). T = varlen.total_q,
 * R = varlen.total_rows, P = varlen.padded_kv_blocks, B = varlen.batch, cap = work_capacity.
 * Every element is written by the launcher (no pre-fill needed). */
typedef struct MsaPrepareOutputs {
    int32_t* error_word;         /* [4]: (code, head, query, slot) of the first invalid top-k
                                    entry (smallest (head*T + query)*16 + slot), zeros if valid;
                                    codes MsaTopkCode (msa/abi.h; 1 negative, 2 >= num_blocks,
                                    3 after the own block, 4 repeat of an earlier slot) */
    int32_t* row_ptr;            /* [4, R + 1]: k2q CSR offsets per head (level-major rows) */
    int32_t* q_indices;          /* [4, T * 16]: fragment-local queries, ascending per row, -1 tail */
    int32_t* qsplit;             /* [4, T * 16]: q_local | writer_rank << 24, -1 tail */
    int32_t* split_counts;       /* [T, 4]: edges per (query, head): entries 0 <= e < num_blocks,
                                    a repeated value once */
    int32_t* scheduler_metadata; /* [cap, 6]: (head, row, q_begin, q_count, fragment, level) in
                                    the order head, row, chunk; rows past the items are 0 */
    int32_t* work_count;         /* [1]: number of work items */
    int32_t* phys_row_ptr;       /* [4, P + 1]: physical CSR offsets per head */
    int32_t* phys_q_indices;     /* [4, T * 16]: packed queries, ascending per block, -1 tail */
    int32_t* phys_valid;         /* [4, T * 16]: visible_keys | writer_rank << 8, -1 tail */
    int32_t* document_workspace_starts; /* [B]: workspace row of each fragment's document */
    int32_t* query_offsets;      /* [B]: k_len - q_len of each fragment */
} MsaPrepareOutputs;

/* Scratch bytes msa_prepare_metadata needs for this layout's sizes (only the size fields of
 * varlen are read): the selection bitmap and its prefixes, 2 x 4 x max(max_blocks, 1) x
 * (ceil(T / 32) + 1) words, plus the row and count arrays (O(B + 4R + 4P) words). Host
 * arithmetic, no CUDA call. Writes *bytes; returns a cudaError_t code. */
int msa_prepare_workspace_bytes(MsaVarlen varlen, size_t* bytes);

/* Validates topk [4, T, 16] and builds every MsaPrepareOutputs tensor from it.
 * target_q_per_cta: chunk size of the work list, a positive multiple of 8
 * (msa_plan::schedule::balanced_target_q_per_cta); work_capacity: rows of scheduler_metadata
 * (msa_plan::schedule::flat_schedule_capacity), >= 1. workspace: workspace_bytes (at least what
 * msa_prepare_workspace_bytes returned) of device memory, any alignment; its contents are
 * scratch. Invalid entries never index out of bounds: CSR edges are the entries with
 * 0 <= e < num_blocks, a repeated value once, as msa_plan::csr. Enqueues one cooperative
 * kernel on stream (docs/perf/schedule.md); never synchronizes. Returns a cudaError_t code. */
int msa_prepare_metadata(const int32_t* topk, MsaVarlen varlen, int32_t target_q_per_cta,
                         int32_t work_capacity, MsaPrepareOutputs out, void* workspace,
                         size_t workspace_bytes, void* stream);

/* Scratch bytes of msa_prepare_validate: a fault word per CTA (at most 2,048 CTAs), 256-byte
 * aligned inside any allocation. */
#define MSA_PREPARE_VALIDATE_WORKSPACE_BYTES (2048 * 8 + 256)

/* The top-k validation of msa_prepare_metadata alone: error_word [4] and split_counts [T, 4]
 * exactly as msa_prepare_metadata writes them, and none of the CSR tables. What the forward
 * needs (it reads only the validated top-k); msa_prepare_metadata builds the tables the backward
 * and the KL backward read (and validates again). workspace: workspace_bytes >=
 * MSA_PREPARE_VALIDATE_WORKSPACE_BYTES of device memory, any alignment, scratch. split_counts
 * may be NULL only when total_q = 0. Enqueues two kernels on stream, the second (one CTA,
 * the error word) a programmatic dependent of the first from compute capability 9.0, which lets
 * the stream's next kernel launch at its start: a kernel launched after this call as a
 * programmatic dependent must execute griddepcontrol.wait before it touches what this call
 * writes (CUDA's rule for programmatic dependents; msa's own kernels do). Never synchronizes.
 * Returns a cudaError_t code. */
int msa_prepare_validate(const int32_t* topk, MsaVarlen varlen, int32_t* error_word,
                         int32_t* split_counts, void* workspace, size_t workspace_bytes,
                         void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_PREPARE_H */
