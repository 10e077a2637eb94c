// Utility family: build information, CUDA error strings, buffer fills and zeroing, and the one
// synchronizing call of the ABI (a device-to-host read of a validation word).
#include "msa/util.h"

#include <cuda_runtime.h>

#include "common/arch_dispatch.cuh"
#include "common/launch.cuh"

#ifndef MSA_KERNEL_ARCHS
#error "MSA_KERNEL_ARCHS must be defined by the build (msa_toolchain::Toolchain::nvcc_flags)"
#endif

namespace {

constexpr unsigned kFillThreads = 256;
// Enough blocks to fill every SM of an H200 several times; larger buffers loop (grid stride).
constexpr size_t kFillMaxBlocks = 8192;

// Writes the 16-byte-aligned middle with uint4 stores (grid stride); the first threads of
// block 0 write the head (before the first aligned word) and the tail (at most 3 each).
__global__ void fill_u32_kernel(uint32_t* out, size_t n, size_t head, size_t n_vec, uint32_t value) {
    const uint4 v = make_uint4(value, value, value, value);
    uint4* mid = reinterpret_cast<uint4*>(out + head);
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
        mid[i] = v;
    }
    if (blockIdx.x == 0) {
        const size_t tail_begin = head + n_vec * 4;
        const size_t t = threadIdx.x;
        if (t < head) {
            out[t] = value;
        } else if (t - head < n - tail_begin) {
            out[tail_begin + (t - head)] = value;
        }
    }
}

}  // namespace

extern "C" const char* msa_kernels_archs(void) { return MSA_KERNEL_ARCHS; }

extern "C" const char* msa_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}

extern "C" int msa_util_fill_u32(uint32_t* out, size_t n, uint32_t value, void* stream) {
    if (n == 0) {
        return cudaSuccess;
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
    if (out == nullptr || addr % alignof(uint32_t) != 0) {
        return cudaErrorInvalidValue;
    }
    size_t head = (16 - addr % 16) % 16 / sizeof(uint32_t);
    head = head < n ? head : n;
    const size_t n_vec = (n - head) / 4;
    size_t blocks = (n_vec + kFillThreads - 1) / kFillThreads;
    blocks = blocks < 1 ? 1 : (blocks > kFillMaxBlocks ? kFillMaxBlocks : blocks);
    return msa::launch(fill_u32_kernel, unsigned(blocks), kFillThreads, static_cast<cudaStream_t>(stream), out, n,
                       head, n_vec, value);
}

extern "C" int msa_util_zero(void* out, size_t bytes, void* stream) {
    if (bytes == 0) {
        return cudaSuccess;
    }
    if (out == nullptr) {
        return cudaErrorInvalidValue;
    }
    return cudaMemsetAsync(out, 0, bytes, static_cast<cudaStream_t>(stream));
}

extern "C" int msa_util_copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
    if (bytes == 0) {
        return cudaSuccess;
    }
    if (dst == nullptr || src == nullptr) {
        return cudaErrorInvalidValue;
    }
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    MSA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    return cudaStreamSynchronize(s);
}

extern "C" int msa_util_device_sm(int* sm, int* sms) {
    if (sm == nullptr || sms == nullptr) {
        return cudaErrorInvalidValue;
    }
    MSA_TRY(msa::current_device_sm(sm));
    return msa::current_device_sms(sms);
}
