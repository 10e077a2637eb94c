// Device buffers from the driver's virtual memory API, optionally compressible (compute data
// compression: the L2 stores compressible lines, all-zero ones above all, in fewer DRAM bytes). The
// driver entry points come through the runtime, so nothing links libcuda.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda.h>
#include <cuda_runtime.h>

namespace vmm {

template <class F>
F driver(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == nullptr) {
        std::fprintf(stderr, "driver entry point %s not found\n", name);
        std::exit(1);
    }
    return reinterpret_cast<F>(fn);
}

#define VMM_CK(x)                                                                   \
    do {                                                                            \
        CUresult r_ = (x);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                   \
            std::fprintf(stderr, "%s:%d: %s: CUresult %d\n", __FILE__, __LINE__, #x, int(r_)); \
            std::exit(1);                                                           \
        }                                                                           \
    } while (0)

inline bool compression_supported(int device) {
    auto get = driver<CUresult (*)(int*, CUdevice_attribute, CUdevice)>("cuDeviceGetAttribute");
    int v = 0;
    VMM_CK(get(&v, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, device));
    return v != 0;
}

struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;       // mapped (a multiple of the granularity)
    bool compressed = false;  // what the driver granted, not what was asked
    CUmemGenericAllocationHandle handle{};
};

// `bytes` of device memory on `device`, compressible if asked and granted.
inline Buffer alloc(size_t bytes, bool compressible, int device = 0) {
    auto granularity = driver<CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)>(
        "cuMemGetAllocationGranularity");
    auto create = driver<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)>(
        "cuMemCreate");
    auto props = driver<CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle)>(
        "cuMemGetAllocationPropertiesFromHandle");
    auto reserve = driver<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>("cuMemAddressReserve");
    auto map = driver<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>("cuMemMap");
    auto access = driver<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>("cuMemSetAccess");
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.allocFlags.compressionType = compressible ? CU_MEM_ALLOCATION_COMP_GENERIC : 0;
    size_t gran = 0;
    VMM_CK(granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    Buffer b;
    b.bytes = (bytes + gran - 1) / gran * gran;
    VMM_CK(create(&b.handle, b.bytes, &prop, 0));
    CUmemAllocationProp got{};
    VMM_CK(props(&got, b.handle));
    b.compressed = got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC;
    CUdeviceptr p = 0;
    VMM_CK(reserve(&p, b.bytes, gran, 0, 0));
    VMM_CK(map(p, b.bytes, 0, b.handle, 0));
    CUmemAccessDesc a{};
    a.location = prop.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    VMM_CK(access(p, b.bytes, &a, 1));
    b.ptr = reinterpret_cast<void*>(p);
    return b;
}

inline void release(Buffer& b) {
    auto unmap = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
    auto free_va = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
    auto rel = driver<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(b.ptr);
    VMM_CK(unmap(p, b.bytes));
    VMM_CK(free_va(p, b.bytes));
    VMM_CK(rel(b.handle));
    b = Buffer{};
}

}  // namespace vmm
