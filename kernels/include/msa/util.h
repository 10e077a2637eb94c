/* Utility family: build information, CUDA error strings, and buffer fills for tests. */
#ifndef MSA_UTIL_H
#define MSA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The targets compiled in, comma-separated, e.g. "sm_90a,sm_80,compute_80". Static storage. */
const char* msa_kernels_archs(void);

/* cudaGetErrorString of a code returned by any msa_* launcher. Static storage. */
const char* msa_error_string(int code);

/* Fills out[0..n) with value on stream (e.g. NaN bit patterns that poison an output before a
 * GPU test). out must be 4-byte aligned; the aligned middle is written with 16-byte stores.
 * Returns a cudaError_t code. */
int msa_util_fill_u32(uint32_t* out, size_t n, uint32_t value, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_UTIL_H */
