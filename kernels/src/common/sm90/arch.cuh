// The sm_90a guard (flash-attention hopper/utils.h's enable_sm90): code that needs Hopper's 'a'
// features (wgmma, setmaxnreg, TMA multicast) compiles only in the sm_90a device pass and to
// nothing in the others (the sm_80 SASS and compute_80 PTX passes, the host pass), so one
// translation unit serves every target of msa_toolchain::ARCHS. The host picks the sm_90a path
// only on a compute capability 9.0 device (common/arch_dispatch.cuh); elsewhere the guarded
// kernel is an empty stub that is never launched.
//
// Guarded code must not be emitted unguarded: keep it in templates or inline functions that
// only guarded code calls, or inside #if MSA_SM90A_ENABLED.
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MSA_SM90A_ENABLED 1
#else
#define MSA_SM90A_ENABLED 0
#endif

namespace msa {

// Dynamic shared memory one block may opt in to on sm_90 (227 KiB).
constexpr int kMaxSmemSm90 = 232448;

// A kernel body for sm_90a: Kernel's operator() holds the sm_90a code, and calling the wrapper
// runs it in the sm_90a pass and does nothing in every other one:
//   struct FwdSm90 { __device__ void operator()(const Params& p) const { ... wgmma ... } };
//   __global__ void fwd_sm90_kernel(const __grid_constant__ Params p) { enable_sm90a<FwdSm90>{}(p); }
template <class Kernel>
struct enable_sm90a : Kernel {
    template <class... Args>
    __device__ __forceinline__ void operator()(Args&&... args) {
#if MSA_SM90A_ENABLED
        Kernel::operator()(static_cast<Args&&>(args)...);
#endif
    }
};

}  // namespace msa
