// Host side: which implementation a launcher runs on the current device, as flash-attention's
// params.arch / ARCH_SWITCH. Families with tensor-core kernels (attention forward and backward,
// the indexer scores, the KL main kernel) dispatch on the device's SM version, read once per
// device and cached for the process: an sm_90a path (wgmma, TMA; its device code guarded by
// common/sm90/arch.cuh) runs only on compute capability 9.0, since sm_90a SASS runs nowhere
// else; the sm_80 path (mma.sync, compiled into the sm_90a SASS as well) runs everywhere else and
// is the fallback. Arch-neutral families (prepare, task build, backward pre/postprocess, util)
// have one path and do not dispatch.
#pragma once

#include <atomic>

#include <cuda_runtime.h>

#include "common/launch.cuh"

namespace msa {

// The current device's compute capability as 10 * major + minor (90 on H100/H200, 80 on A100),
// read with cudaDeviceGetAttribute the first time per device and cached (thread-safe: racing
// first calls store the same value).
inline cudaError_t current_device_sm(int* sm) {
    int device = 0;
    MSA_TRY(cudaGetDevice(&device));
    constexpr int kCachedDevices = 64;
    static std::atomic<int> cache[kCachedDevices];  // 0: not read yet
    const bool cacheable = device >= 0 && device < kCachedDevices;
    if (cacheable) {
        const int cached = cache[device].load(std::memory_order_relaxed);
        if (cached != 0) {
            *sm = cached;
            return cudaSuccess;
        }
    }
    int major = 0, minor = 0;
    MSA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MSA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    *sm = 10 * major + minor;
    if (cacheable) cache[device].store(*sm, std::memory_order_relaxed);
    return cudaSuccess;
}

// The current device's multiprocessor count (the persistent sm_90a kernels launch one CTA per
// SM), read once per device and cached like current_device_sm.
inline cudaError_t current_device_sms(int* sms) {
    int device = 0;
    MSA_TRY(cudaGetDevice(&device));
    constexpr int kCachedDevices = 64;
    static std::atomic<int> cache[kCachedDevices];
    const bool cacheable = device >= 0 && device < kCachedDevices;
    if (cacheable) {
        const int cached = cache[device].load(std::memory_order_relaxed);
        if (cached != 0) {
            *sms = cached;
            return cudaSuccess;
        }
    }
    MSA_TRY(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));
    if (cacheable) cache[device].store(*sms, std::memory_order_relaxed);
    return cudaSuccess;
}

// Whether a device of compute capability sm runs sm_90a code.
constexpr bool runs_sm90a(int sm) { return sm == 90; }

// Runs the launch of the current device's path: sm90a() on a compute capability 9.0 device,
// sm80() elsewhere. Both return a cudaError_t.
template <class Sm80, class Sm90a>
cudaError_t dispatch_arch(Sm80&& sm80, Sm90a&& sm90a) {
    int sm = 0;
    MSA_TRY(current_device_sm(&sm));
    return runs_sm90a(sm) ? sm90a() : sm80();
}

// The same for a family that has only its sm_80 path so far (it runs on sm_90a too): the device
// is still read, so adding an sm_90a path is one more argument.
template <class Sm80>
cudaError_t dispatch_arch(Sm80&& sm80) {
    int sm = 0;
    MSA_TRY(current_device_sm(&sm));
    return sm80();
}

}  // namespace msa
