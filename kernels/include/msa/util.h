/* Utility family: build information, CUDA error strings, buffer fills (poisoning for tests, zeroing
 * of accumulators) and the synchronizing device-to-host read of a validation word. */
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

/* The current device's compute capability as 10 * major + minor (*sm) and its multiprocessor
 * count (*sms): the values the launchers dispatch on and size their persistent grids by, read
 * with cudaDeviceGetAttribute the first time per device and cached for the process (so a call
 * before a CUDA-graph capture makes the captured launchers read only the cache). Returns a
 * cudaError_t code. */
int msa_util_device_sm(int* sm, int* sms);

/* Sets bytes bytes at out to zero on stream (cudaMemsetAsync; any alignment). Returns a
 * cudaError_t code. */
int msa_util_zero(void* out, size_t bytes, void* stream);

/* Copies bytes bytes from device memory src to host memory dst on stream and waits for the
 * stream: the one launcher of the ABI that synchronizes (the explicit validation read of
 * msa::raw::validate_prepare); not allowed while the stream is being captured. Returns a
 * cudaError_t code. */
int msa_util_copy_to_host(void* dst, const void* src, size_t bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_UTIL_H */
