// M8: the backward's fp32 dQ accumulator (T = 12,288: 384 MiB) in compressible memory. Its memset
// writes only zero lines, which compute data compression stores in a fraction of the DRAM bytes;
// the first bulk reduce-add into each line then reads them back compressed. After the adds the
// values are random fp32 and compress no more, so the cast moves the same bytes. Decides whether a
// compressible accumulator lowers the pre/post share (#12) where no kernel form could.
//   memset   cudaMemsetAsync of the accumulator
//   reduce   one bulk reduce-add of 8 KiB (the main kernel's dQ path) into every chunk after a
//            memset (untimed), one issuing thread per CTA, 16 in flight, one CTA per SM
//   cast     the epilogue's dQ cast (cast_dq_chunks) of the reduced accumulator
//   cycle    memset + reduce + cast, timed together
// for cudaMalloc, a VMM allocation without compression and one with it; every reduced buffer is
// compared with cudaMalloc's byte for byte. Medians of 9 single launches after 2 warm-ups.
//   m8_compressible
#include "common.cuh"
#include "microbench/vmm.cuh"
#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"
#include "attention/dq_fragments.cuh"

namespace {

constexpr int kT = 12288;
constexpr size_t kElems = size_t(kT) * 64 * 128;
constexpr int kChunk = 2048;  // floats: one (query, group) dQ chunk
constexpr int kChunks = int(kElems / kChunk);

__global__ void __launch_bounds__(128) reduce_pass(float* acc) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
    __shared__ alignas(128) float src[kChunk];
    for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
        uint32_t h = (uint32_t(i) + 4096u * blockIdx.x) * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        src[i] = (int(h >> 8) - (1 << 23)) * (1.f / (1 << 23));
    }
    msa::sm90::fence_proxy_async_smem();
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int c = blockIdx.x; c < kChunks; c += gridDim.x) {
        msa::sm90::bulk_reduce_add_f32(acc + size_t(c) * kChunk, src, kChunk * 4);
        msa::sm90::bulk_commit();
        asm volatile("cp.async.bulk.wait_group.read 15;\n" ::: "memory");
    }
    msa::sm90::bulk_wait_all();
#endif
}

__global__ void __launch_bounds__(msa::bwd90::kCastThreads) cast_pass(const float* acc, uint16_t* dq) {
    msa::bwd90::cast_dq_chunks(acc, dq, blockIdx.x);
}

// Median of 9 timed launches of `timed` after 2 warm-ups, `setup` before each (untimed), in µs.
template <class S, class F>
float time_us(S setup, F timed) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> us;
    for (int i = 0; i < 11; ++i) {
        setup();
        CK(cudaEventRecord(a));
        timed();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (i >= 2) us.push_back(ms * 1000.f);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(us);
}

}  // namespace

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t bytes = kElems * 4;
    const bool supported = vmm::compression_supported(0);
    std::printf("M8 T=%d, dq_accum %.0f MiB, %d SMs, generic compression supported: %s\n", kT, bytes / 1048576.0, sms,
                supported ? "yes" : "no");
    uint16_t* dq;
    CK(cudaMalloc(&dq, kElems * 2));
    float* plain;
    CK(cudaMalloc(&plain, bytes));
    vmm::Buffer vm = vmm::alloc(bytes, false), vc = vmm::alloc(bytes, true);
    std::printf("vmm without compression: granted %s; with: granted %s\n", vm.compressed ? "compressed" : "plain",
                vc.compressed ? "compressed" : "plain");
    const unsigned cast_grid = msa::bwd90::dq_cast_ctas(kT);
    std::vector<uint8_t> ref(bytes), got(bytes);
    bool ok = true;
    std::printf("%-12s %10s %10s %10s %10s\n", "buffer", "memset_us", "reduce_us", "cast_us", "cycle_us");
    struct Target {
        const char* name;
        float* acc;
    };
    for (const Target t : {Target{"cudaMalloc", plain}, Target{"vmm", static_cast<float*>(vm.ptr)},
                           Target{"vmm+comp", static_cast<float*>(vc.ptr)}}) {
        auto zero = [&] { CK(cudaMemsetAsync(t.acc, 0, bytes)); };
        auto reduce = [&] { reduce_pass<<<sms, 128>>>(t.acc); };
        auto cast = [&] { cast_pass<<<cast_grid, msa::bwd90::kCastThreads>>>(t.acc, dq); };
        const float m = time_us([] {}, zero);
        const float r = time_us(zero, reduce);
        const float c = time_us([] {}, cast);
        const float all = time_us([] {}, [&] {
            zero();
            reduce();
            cast();
        });
        std::printf("%-12s %10.1f %10.1f %10.1f %10.1f\n", t.name, m, r, c, all);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(t.acc == plain ? ref.data() : got.data(), t.acc, bytes, cudaMemcpyDeviceToHost));
        if (t.acc != plain && got != ref) {
            std::printf("%s: the reduced accumulator differs from cudaMalloc's\n", t.name);
            ok = false;
        }
    }
    vmm::release(vm);
    vmm::release(vc);
    CK(cudaFree(plain));
    CK(cudaFree(dq));
    std::printf("M8 %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
