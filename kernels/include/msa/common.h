/* Types shared by every msa-rs kernel family. Plain C so bindgen and nvcc read the same ABI. */
#ifndef MSA_COMMON_H
#define MSA_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The packed varlen layout of one call, uploaded once per layout (msa::cuda::DeviceLayout).
 * Fragment b: first = fragment_first[b], k_base = cu_seqlens_k[first],
 * k_len = cu_seqlens_k[b+1] - k_base, q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b];
 * local query i sits at document position k_len - q_len + i. */
typedef struct MsaVarlen {
    const int32_t* cu_seqlens_q;    /* [batch + 1] */
    const int32_t* cu_seqlens_k;    /* [batch + 1] */
    const int32_t* fragment_first;  /* [batch]: fragment_indices, or b when absent */
    const int32_t* query_fragment;  /* [total_q]: fragment of each packed query */
    const int32_t* block_key_start; /* [padded_kv_blocks]: packed K row of key 0, -1 for padding */
    const int32_t* block_key_count; /* [padded_kv_blocks]: keys stored in the block, 0 for padding */
    int32_t batch;
    int32_t total_q;
    int32_t total_k;
    int32_t total_rows;       /* sum over fragments of ceil(k_len / 128) */
    int32_t padded_kv_blocks; /* (total_k + (batch + 1) * 128 - 1) / 128 */
    int32_t max_blocks;       /* ceil(max k_len / 128) */
} MsaVarlen;

#ifdef __cplusplus
}
#endif

#endif /* MSA_COMMON_H */
