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

constexpr int kCachedDevices = 64;

// *value for the current device: read(device, value) the first time per device, then the value
// cached in `cache` (the caller's own static array; thread-safe: racing first calls store the
// same value). A read value must not be 0, which marks a device not read yet.
template <class Read>
cudaError_t cached_per_device(std::atomic<int> (&cache)[kCachedDevices], int* value, Read read) {
    int device = 0;
    MSA_TRY(cudaGetDevice(&device));
    const bool cacheable = device >= 0 && device < kCachedDevices;
    if (cacheable) {
        const int cached = cache[device].load(std::memory_order_relaxed);
        if (cached != 0) {
            *value = cached;
            return cudaSuccess;
        }
    }
    MSA_TRY(read(device, value));
    if (cacheable) cache[device].store(*value, std::memory_order_relaxed);
    return cudaSuccess;
}

// The current device's compute capability as 10 * major + minor (90 on H100/H200, 80 on A100),
// read with cudaDeviceGetAttribute once per device.
inline cudaError_t current_device_sm(int* sm) {
    static std::atomic<int> cache[kCachedDevices];
    return cached_per_device(cache, sm, [](int device, int* out) -> cudaError_t {
        int major = 0, minor = 0;
        MSA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        MSA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        *out = 10 * major + minor;
        return cudaSuccess;
    });
}

// The current device's multiprocessor count (the persistent sm_90a kernels launch one CTA per
// SM), read once per device.
inline cudaError_t current_device_sms(int* sms) {
    static std::atomic<int> cache[kCachedDevices];
    return cached_per_device(cache, sms, [](int device, int* out) {
        return cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, device);
    });
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
