// M9: the dQ cast by the last contributor (#12's open idea), against today's separate cast pass.
// The backward reduces dQ as 8 KiB fp32 chunks (one (query, group)) into an accumulator of
// T x 4 chunks, K = 16 adds per chunk, then casts it to bf16 in a pass of its own (403 MB read,
// 201 MB written at T = 12,288). Here warps issue the same adds (lane 0: cp.reduce.async.bulk
// .add.f32 of a shared-memory chunk of ones):
//   plain     adds with up to 16 in flight per issuing lane, then the cast kernel
//   lag<L>    each add published on its chunk's counter (fence.proxy.async.global, then
//             atom.acq_rel.gpu) once complete, L adds after it was issued (L = 0: at once); the
//             warp whose add is the chunk's K-th reads the chunk (from L2) and writes its bf16 dQ;
//             no cast pass, but the counters are zeroed with the accumulator
// in two add orders: recent (block-major over a 16-block window, as recent16's KV-outer items)
// and random (a stride permutation). Every dQ value must equal K afterwards (checked).
//   m9_last_cast
#include <algorithm>
#include <cstdio>
#include <vector>


#include "common.cuh"
#include "common/intrinsics.cuh"
#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"

namespace {

using msa::pack_bf16;

constexpr int kValues = 2048;  // one chunk: a query's dQ for one group
constexpr int kK = 16;         // adds per chunk
constexpr int kChunks = 12288 * 4, kPerBlock = 128 * 4, kBlocks = kChunks / kPerBlock;
constexpr long long kOps = 1LL * kChunks * kK;

// The chunk of add j: recent = block-major, block b adding to the chunks of blocks b..b+15.
__device__ __forceinline__ int chunk_of(long long j, bool recent) {
    if (!recent) return static_cast<int>((j * 7919) % kChunks);
    const long long b = j / (kK * kPerBlock), r = j % (kK * kPerBlock);
    return static_cast<int>(((b + r / kPerBlock) % kBlocks) * kPerBlock + r % kPerBlock);
}

// The last contributor of chunk c (count reached kK): the warp reads the chunk (from L2) and
// writes its bf16 dQ.
__device__ __forceinline__ void publish(float* acc, unsigned* count, uint32_t* dq, int c, int lane) {
    unsigned old = 0;
    if (lane == 0) {
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(count + c) : "memory");
    }
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != kK - 1) return;  // every other add was published before its count
    const float4* from = reinterpret_cast<const float4*>(acc + static_cast<size_t>(c) * kValues);
    uint2* to = reinterpret_cast<uint2*>(dq + static_cast<size_t>(c) * (kValues / 2));
#pragma unroll
    for (int i = 0; i < kValues / 4 / 32; ++i) {
        const float4 x = __ldcg(from + i * 32 + lane);
        __stcs(to + i * 32 + lane, make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w)));
    }
}

// kLag < 0: adds only (up to 16 in flight per issuing lane). kLag >= 0: each add is published on
// its chunk's counter once complete, kLag adds later (cp.async.bulk.wait_group kLag: all older
// bulk groups have completed), and the chunk's last add casts it.
template <int kLag>
__global__ void __launch_bounds__(256) adds(float* acc, unsigned* count, uint32_t* dq, bool recent) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900)
    __shared__ alignas(128) float src[kValues];
    __shared__ int ring[8][kLag > 0 ? kLag + 1 : 1];
    for (int i = threadIdx.x; i < kValues; i += blockDim.x) src[i] = 1.0f;
    msa::sm90::fence_proxy_async_smem();
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x / 32;
    const long long warps = 1LL * gridDim.x * (blockDim.x / 32);
    int n = 0;  // adds issued by this warp
    for (long long j = blockIdx.x * (blockDim.x / 32) + w; j < kOps; j += warps, ++n) {
        const int c = chunk_of(j, recent);
        if (lane == 0) {
            msa::sm90::bulk_reduce_add_f32(acc + static_cast<size_t>(c) * kValues, src, kValues * 4);
            msa::sm90::bulk_commit();
        }
        if constexpr (kLag < 0) {
            if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 15;\n" ::: "memory");
        } else {
            constexpr int R = kLag + 1;
            if (lane == 0) ring[w][n % R] = c;
            __syncwarp();
            if (n >= kLag) {
                if (lane == 0) asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kLag) : "memory");
                publish(acc, count, dq, ring[w][(n - kLag) % R], lane);
            }
        }
    }
    if (lane == 0) msa::sm90::bulk_wait_all();
    if constexpr (kLag > 0) {
        constexpr int R = kLag + 1;
        __syncwarp();
        for (int m = max(0, n - kLag); m < n; ++m) publish(acc, count, dq, ring[w][m % R], lane);
    }
#endif
}

__global__ void cast(const float4* acc, uint2* dq, size_t n4) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
        const float4 x = __ldcs(acc + i);
        __stcs(dq + i, make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w)));
    }
}

__global__ void check(const uint32_t* dq, size_t n, unsigned long long* bad) {
    const uint32_t want = pack_bf16(float(kK), float(kK));
    unsigned long long b = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        b += dq[i] != want;
    if (b) atomicAdd(bad, b);
}

}  // namespace

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t acc_bytes = size_t(kChunks) * kValues * 4, dq_bytes = acc_bytes / 2;
    float* acc;
    unsigned* count;
    uint32_t* dq;
    unsigned long long* bad;
    CK(cudaMalloc(&acc, acc_bytes));
    CK(cudaMalloc(&count, kChunks * sizeof(unsigned)));
    CK(cudaMalloc(&dq, dq_bytes));
    CK(cudaMalloc(&bad, 8));
    cudaEvent_t ev[4];
    for (auto& e : ev) CK(cudaEventCreate(&e));
    std::printf("M9: %d chunks of 8 KiB, %d adds each (%.0f MB accumulator)\n", kChunks, kK, acc_bytes / 1e6);
    std::printf("%7s %6s %5s %10s %10s %10s %10s %8s\n", "order", "form", "CTAs", "zero_us", "adds_us", "cast_us",
                "total_us", "dq_ok");
    for (bool recent : {true, false}) {
        for (int lag : {-1, 0, 4, 12}) {
            const bool last = lag >= 0;
            for (int per_sm : {1, 2}) {
                const int ctas = sms * per_sm;
                std::vector<float> z, a, c, t;
                for (int rep = 0; rep < 6; ++rep) {
                    CK(cudaMemset(dq, 0xff, dq_bytes));
                    CK(cudaEventRecord(ev[0]));
                    CK(cudaMemsetAsync(acc, 0, acc_bytes));
                    if (last) CK(cudaMemsetAsync(count, 0, kChunks * sizeof(unsigned)));
                    CK(cudaEventRecord(ev[1]));
                    switch (lag) {
                        case -1: adds<-1><<<ctas, 256>>>(acc, count, dq, recent); break;
                        case 0: adds<0><<<ctas, 256>>>(acc, count, dq, recent); break;
                        case 4: adds<4><<<ctas, 256>>>(acc, count, dq, recent); break;
                        default: adds<12><<<ctas, 256>>>(acc, count, dq, recent); break;
                    }
                    CK(cudaGetLastError());
                    CK(cudaEventRecord(ev[2]));
                    if (!last) cast<<<sms * 8, 256>>>(reinterpret_cast<const float4*>(acc), reinterpret_cast<uint2*>(dq), acc_bytes / 16);
                    CK(cudaEventRecord(ev[3]));
                    CK(cudaEventSynchronize(ev[3]));
                    float m[3];
                    for (int i = 0; i < 3; ++i) CK(cudaEventElapsedTime(&m[i], ev[i], ev[i + 1]));
                    if (rep > 0) z.push_back(m[0] * 1e3f), a.push_back(m[1] * 1e3f), c.push_back(m[2] * 1e3f),
                                 t.push_back((m[0] + m[1] + m[2]) * 1e3f);
                }
                CK(cudaMemset(bad, 0, 8));
                check<<<sms * 8, 256>>>(dq, dq_bytes / 4, bad);
                unsigned long long b = 0;
                CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
                auto med = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
                char form[16];
                std::snprintf(form, sizeof form, last ? "lag%d" : "plain", lag);
                std::printf("%7s %6s %5d %10.1f %10.1f %10.1f %10.1f %8s\n", recent ? "recent" : "random", form, ctas, med(z), med(a), med(c), med(t), b == 0 ? "yes" : "NO");
            }
        }
    }
    return 0;
}
