// Host-side launch helpers of every launcher: early return on a CUDA error (MSA_TRY) and the
// launch sequences, so that no translation unit repeats the attribute / launch /
// cudaGetLastError steps. Every launcher returns the cudaError_t of its first failing step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include <cuda_runtime.h>

// Evaluates expr (a cudaError_t) and returns it from the enclosing function unless it is
// cudaSuccess.
#define MSA_TRY(expr)                                 \
    do {                                              \
        const cudaError_t msa_try_err_ = (expr);      \
        if (msa_try_err_ != cudaSuccess) return msa_try_err_; \
    } while (0)

namespace msa {

// Whether p is 16-byte aligned (the launchers' vector-access requirement).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// kernel<<<grid, block, 0, stream>>>(args...), then the launch error.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
    kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
}

// Sets the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize to smem (required above 48 KB;
// cheap, and set at every launch so that it holds for whichever device is current).
template <class... Params>
cudaError_t opt_in_smem(void (*kernel)(Params...), size_t smem) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

// The same with smem bytes of dynamic shared memory, opted in first.
template <class... Params, class... Args>
cudaError_t launch_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        Args&&... args) {
    MSA_TRY(opt_in_smem(kernel, smem));
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
}

// cudaLaunchKernelEx with one launch attribute (the launch forms below), then the launch error.
template <class... Params, class... Args>
cudaError_t launch_with(cudaLaunchAttribute attr, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    MSA_TRY(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
    return cudaGetLastError();
}

// launch_smem as a programmatic dependent launch (cudaLaunchAttributeProgrammaticStreamSerialization):
// the kernel may start while the stream's previous kernel still runs, once that kernel triggers
// (griddepcontrol.launch_dependents); it must execute griddepcontrol.wait before it touches what
// that kernel writes. Stream capture records the dependency as a programmatic graph edge.
template <class... Params, class... Args>
cudaError_t launch_smem_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  Args&&... args) {
    MSA_TRY(opt_in_smem(kernel, smem));
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    return launch_with(attr, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// kernel<<<grid, block, 0, stream>>>(args...) as a cooperative launch (cudaLaunchKernelEx with
// cudaLaunchAttributeCooperative, which stream capture records as a cooperative kernel node), so
// the kernel may call cooperative_groups::this_grid().sync(). The grid must fit on the device at
// once (SMs x occupancy); the launch fails otherwise.
template <class... Params, class... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                               Args&&... args) {
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    return launch_with(attr, kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace msa
