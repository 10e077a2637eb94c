// Programmatic dependent launch (Hopper's sm_90a code): a kernel started by launch_dependent
// may be scheduled while the stream's previous kernel finishes, so its launch and prologue hide
// behind that kernel's last wave instead of following it. It must call grid_dependency_wait()
// before it touches memory that earlier stream work writes (the wait returns once the previous
// kernel has completed and its writes are visible; transitively, everything before it). A kernel
// lets its dependent launch early by allow_dependents() (the dependent still waits for its
// completion). Both compile to nothing below sm_90 (the sm_80 SASS and the compute_80 PTX that
// newer GPUs JIT), so launch_dependent launches programmatically only where the sm_90a code runs
// (runs_sm90a): elsewhere the kernels have no wait and must not overlap their predecessor.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "common/arch_dispatch.cuh"
#include "common/launch.cuh"

namespace msa {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the stream's
// previous kernel on compute capability 9.0 (a plain launch elsewhere). Only for kernels that
// call grid_dependency_wait() first; dynamic shared memory is opted in as launch_smem does.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args&&... args) {
    int sm = 0;
    MSA_TRY(current_device_sm(&sm));
    if (smem > 0) MSA_TRY(opt_in_smem(kernel, smem));
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    return launch_ex(kernel, grid, block, smem, stream, runs_sm90a(sm) ? &attr : nullptr, std::forward<Args>(args)...);
}

}  // namespace msa
