/* Task-build family: NeMo's backward task build (docs/contract.md §5.2) for CP fragments,
 * bit-exact with msa_plan::backward::task_build (the host mirror), including every intermediate
 * word of the scratch buffer. Four kernels after a 0xFF fill of both buffers:
 *   scan_work        1 CTA x 1024: inclusive task ends per work item, exact counts, cleared bins;
 *   assign_segments  ceil(capacity / 256) x 256: decode forward-order tasks, segment atomics;
 *   scan_bins        1 CTA x 1024: exclusive bin offsets, flag 2 for noncontiguous segments;
 *   scatter_tables   ceil(capacity / 256) x 256: locality-ordered task rows; task 0's thread
 *                    writes the CTA-walk descriptor (rows_per_cta / chunk_map on the device).
 * Exact task counts stay on the device: no host synchronization, graph-capturable.
 *
 * Buffer layout (int32 words; positions MSA_DESC_*, MSA_BIN_*, MSA_DEC_*, MSA_META_* of msa/abi.h,
 * mirrored by msa_plan::backward::abi):
 *   scratch = desc[8] | task_ends[work_capacity] | task_segments[capacity] | bins[4, bins]
 *             | task_decode[capacity, 3]
 *   tables  = task_meta[capacity, 4] | task_qrows[capacity, 8] | task_qpos[capacity, 8]
 * Words no kernel writes stay -1. */
#ifndef MSA_TASK_BUILD_H
#define MSA_TASK_BUILD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The forward-derived schedule (msa_plan::MsaBackwardSchedule), device arrays. The kernels trust
 * the work items (msa_plan::build_backward_tasks checks them on the host). */
typedef struct MsaTaskBuildInputs {
    const int32_t* row_ptr;                   /* [4, rows + 1] */
    const int32_t* q_indices;                 /* [4, edge_capacity]: document-local queries */
    const int32_t* scheduler_metadata;        /* [work_capacity, 6] */
    const int32_t* work_count;                /* [1] */
    const int32_t* cu_seqlens;                /* [documents + 1] */
    const int32_t* document_workspace_starts; /* [documents] */
    const int32_t* query_offsets;             /* [documents]: added to task_qpos */
} MsaTaskBuildInputs;

/* Shapes of one build; the launcher derives capacity, windows, kblocks and bins from them with
 * msa_plan::task_build_sizes' rule. */
typedef struct MsaTaskBuildShape {
    int32_t rows;           /* CSR rows per head (>= 1) */
    int32_t edge_capacity;  /* q_indices width (>= 1) */
    int32_t work_capacity;  /* scheduler_metadata rows (>= 1) */
    int32_t documents;      /* >= 1 */
    int32_t num_tokens;     /* T: 512-query locality windows */
    int32_t workspace_rows; /* W, a multiple of 128 */
    int32_t num_sms;        /* SMs the CTA walk is planned for (> 0) */
} MsaTaskBuildShape;

/* Fills scratch and tables with -1, then runs the four kernels on stream. scratch_words and
 * table_words must equal msa_plan's TaskBuildSizes (8 + work_capacity + capacity + 4 bins +
 * 3 capacity, and capacity * 20), else nothing is enqueued and cudaErrorInvalidValue is returned
 * (as for bins > 2^22 or a shape out of range). tables must be 16-byte aligned. Returns a
 * cudaError_t code. */
int msa_task_build_tables(MsaTaskBuildInputs inputs, MsaTaskBuildShape shape, int32_t* scratch,
                          size_t scratch_words, int32_t* tables, size_t table_words,
                          void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_TASK_BUILD_H */
