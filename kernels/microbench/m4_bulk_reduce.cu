// M4: throughput of bulk fp32 reduce-adds from shared memory (cp.reduce.async.bulk .add.f32, the
// backward's dQ path) in 8 KiB chunks into targets of 32 MB (L2-resident) and 400 MB (not), at
// random chunk offsets, one issuing thread per CTA with up to 16 operations in flight, 1 and 2
// CTAs per SM. The sum of the target afterwards proves every add landed. It decides whether
// the random-selection backward is exposed to dQ reductions (docs/perf/attention-backward-sm90.md).
// The same with .add.u64 in 16 KiB chunks (the same 2,048 values as 64-bit fixed point: an
// order-free, hence deterministic, dQ accumulation) and targets twice the size.
//
//   m4_bulk_reduce
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "common/sm90/wgmma.cuh"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                       \
        }                                                                                       \
    } while (0)

constexpr int kValues = 2048;  // one chunk: a query's dQ for one group

template <typename T>
__device__ __forceinline__ void reduce_add(T* dst, uint32_t src);
template <>
__device__ __forceinline__ void reduce_add<float>(float* dst, uint32_t s) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(s),
                 "r"(kValues * 4)
                 : "memory");
}
template <>
__device__ __forceinline__ void reduce_add<unsigned long long>(unsigned long long* dst, uint32_t s) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;\n" ::"l"(dst), "r"(s),
                 "r"(kValues * 8)
                 : "memory");
}

template <typename T>
__global__ void __launch_bounds__(128) bulk_reduce(T* target, int chunks, int ops) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
    __shared__ alignas(128) T src[kValues];
    for (int i = threadIdx.x; i < kValues; i += blockDim.x) src[i] = T(1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x != 0) return;
    const uint32_t s = msa::sm90::smem_u32(src);
    uint32_t h = 0x9E3779B9u * (blockIdx.x + 7);
    for (int i = 0; i < ops; ++i) {
        h ^= h << 13;
        h ^= h >> 17;
        h ^= h << 5;
        reduce_add(target + size_t(h % chunks) * kValues, s);
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 15;\n" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

template <typename T>
__global__ void sum(const T* x, size_t n, double* out) {
    double acc = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) acc += x[i];
    atomicAdd(out, acc);
}

template <typename T>
void run(const char* name, int sms, cudaEvent_t e0, cudaEvent_t e1, double* dsum) {
    constexpr int kChunk = kValues * int(sizeof(T));
    for (size_t mb : {32, 400}) {
        const size_t bytes = (mb << 20) / 4 * sizeof(T);
        const int chunks = int(bytes / kChunk);
        T* target;
        CK(cudaMalloc(&target, bytes));
        for (int per_sm : {1, 2}) {
            const int ctas = sms * per_sm, ops = 2000;
            std::vector<float> ms;
            CK(cudaMemset(target, 0, bytes));
            for (int rep = 0; rep < 6; ++rep) {
                CK(cudaEventRecord(e0));
                bulk_reduce<T><<<ctas, 128>>>(target, chunks, ops);
                CK(cudaGetLastError());
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float m;
                CK(cudaEventElapsedTime(&m, e0, e1));
                if (rep > 0) ms.push_back(m);
            }
            CK(cudaMemset(dsum, 0, 8));
            sum<T><<<1024, 256>>>(target, bytes / sizeof(T), dsum);
            double got = 0;
            CK(cudaMemcpy(&got, dsum, 8, cudaMemcpyDeviceToHost));
            const double want = 6.0 * ctas * ops * kValues;
            std::sort(ms.begin(), ms.end());
            const float med = ms[ms.size() / 2];
            std::printf("%6s %10zu %6d %10.2f %12.1f %10.3f %10s\n", name, bytes >> 20, ctas,
                        double(ctas) * ops * kChunk / med / 1e9, double(ctas) * ops * kValues / med / 1e6, med,
                        got == want ? "yes" : "NO");
        }
        CK(cudaFree(target));
    }
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::printf("M4: cp.reduce.async.bulk, chunks of %d values, random offsets, 16 in flight per CTA\n", kValues);
    std::printf("%6s %10s %6s %10s %12s %10s %10s\n", "type", "target_MB", "CTAs", "TB/s", "Gvalues/s", "ms", "sum_ok");
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double* dsum;
    CK(cudaMalloc(&dsum, 8));
    run<float>("f32", sms, e0, e1, dsum);
    run<unsigned long long>("u64", sms, e0, e1, dsum);
    return 0;
}
