// M1: L2 -> SM bandwidth of TMA tile loads, as the sm_90a forward issues them (boxes of 64 bf16 x
// 128 rows = 16 KiB out of a [rows, 512] bf16 tensor, 128-byte swizzle), from resident sets of
// 8 to 96 MB and from 2 GB (HBM). One persistent CTA per SM keeps 12 boxes (192 KiB) in flight
// and picks boxes at random inside the window. It decides whether query-outer tiles that share
// blocks only partly (r < 8) can be fed (docs/perf/attention-forward-sm90.md).
//
//   m1_tma_l2
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                       \
        }                                                                                       \
    } while (0)

constexpr int kBox = 16384;
constexpr int kInFlight = 12;

__global__ void __launch_bounds__(32, 1) tma_stream(const __grid_constant__ CUtensorMap map, int rows, int loads,
                                                    unsigned* sink) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
    using namespace msa::sm90;
    extern __shared__ uint8_t raw[];
    const uint32_t pad = (1024u - (smem_u32(raw) & 1023u)) & 1023u;
    uint8_t* buf = raw + pad;
    __shared__ uint64_t full[kInFlight];
    if (threadIdx.x != 0) return;
    for (int i = 0; i < kInFlight; ++i) mbar_init(&full[i], 1);
    mbar_fence_init();
    const int row_blocks = rows / 128;
    uint32_t h = 0x9E3779B9u * (blockIdx.x + 1);
    auto issue = [&](int i) {
        h ^= h << 13;
        h ^= h >> 17;
        h ^= h << 5;
        const int col = (h & 7) * 64, rb = (h >> 3) % row_blocks;
        mbar_arrive_expect_tx(&full[i % kInFlight], kBox);
        tma_load_2d(buf + (i % kInFlight) * kBox, &map, &full[i % kInFlight], col, rb * 128);
    };
    for (int i = 0; i < kInFlight && i < loads; ++i) issue(i);
    for (int i = 0; i < loads; ++i) {
        mbar_wait(&full[i % kInFlight], (i / kInFlight) & 1);
        if (i + kInFlight < loads) issue(i + kInFlight);
    }
    sink[blockIdx.x] = buf[threadIdx.x];
#endif
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t max_bytes = size_t(2) << 30;
    void* base;
    CK(cudaMalloc(&base, max_bytes));
    CK(cudaMemset(base, 1, max_bytes));
    unsigned* sink;
    CK(cudaMalloc(&sink, sms * 4));
    const int smem = kInFlight * kBox + 1024;
    CK(cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::printf("M1: TMA 16 KiB boxes (64 bf16 x 128 rows, [rows, 512] tensor, SW128), %d CTAs x %d in flight\n", sms,
                kInFlight);
    std::printf("%12s %12s %12s\n", "window_MB", "TB/s", "ms");
    const size_t windows_mb[] = {8, 16, 32, 48, 64, 96, 2048};
    for (size_t mb : windows_mb) {
        const size_t bytes = mb << 20;
        const int rows = int(bytes / 1024) / 128 * 128;
        CUtensorMap map;
        const uint64_t dims[2] = {512, uint64_t(rows)};
        const uint64_t strides[1] = {1024};
        const uint32_t box[2] = {64, 128};
        CK(msa::sm90::encode_bf16_sw128(&map, base, 2, dims, strides, box));
        const int loads = 4000;
        std::vector<float> ms;
        for (int rep = 0; rep < 7; ++rep) {
            CK(cudaEventRecord(e0));
            tma_stream<<<sms, 32, smem>>>(map, rows, loads, sink);
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            if (rep > 0) ms.push_back(m);
        }
        std::sort(ms.begin(), ms.end());
        const float med = ms[ms.size() / 2];
        const double moved = double(sms) * loads * kBox;
        std::printf("%12zu %12.2f %12.3f\n", mb, moved / med / 1e9, med);
    }
    return 0;
}
