// M6: how a consumer warp should release a pipeline stage (the "empty" mbarrier) in the
// warp-specialized sm_90a kernels, decided by compute-sanitizer racecheck and by cost.
// A producer warp refills 2 stages (a generic store of the stage's info word plus a bulk TMA copy
// of 512 bytes, completing on the stage's "full" barrier); 8 consumer warps read both and release
// the stage in one of two ways:
//   warp: __syncwarp, then lane 0 arrives (the barrier counts 8 warps; the kernels' release());
//   all:  every consumer thread arrives (the barrier counts 256 threads).
// Both orders are valid under the PTX memory model (bar.warp.sync orders the lanes' reads
// before lane 0's release-arrive); racecheck may not follow the warp barrier. Run it plain for
// the cost of a stage hand-off, and under `compute-sanitizer --tool racecheck` per variant.
//   m6_release [warp|all] [iterations]
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "common/sm90/barrier.cuh"
#include "common/sm90/tma.cuh"

using namespace msa::sm90;

namespace {

constexpr int kStages = 2, kConsumers = 256, kWords = 128;  // 512 bytes per stage

struct Smem {
    alignas(128) float buf[kStages][kWords];
    int info[kStages];
    uint64_t full[kStages], empty[kStages];
};

template <bool kAll>
__global__ void __launch_bounds__(288) pipeline(const float* src, float* out, int iters) {
    __shared__ Smem sm;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&sm.full[s], 1);
            mbar_init(&sm.empty[s], kAll ? kConsumers : kConsumers / 32);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (tid >= kConsumers) {  // producer warp
        if (tid == kConsumers) {
            for (int i = 0; i < iters; ++i) {
                const int st = i % kStages;
                mbar_wait(&sm.empty[st], ((i / kStages) & 1) ^ 1);
                sm.info[st] = i;
                mbar_arrive_expect_tx(&sm.full[st], kWords * 4);
                bulk_load(sm.buf[st], src + (i & 63) * kWords, kWords * 4, &sm.full[st]);
            }
        }
        return;
    }
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
        const int st = i % kStages;
        mbar_wait(&sm.full[st], (i / kStages) & 1);
        acc += sm.buf[st][tid & (kWords - 1)] + float(sm.info[st] & 1);
        if (kAll) {
            mbar_arrive(&sm.empty[st]);
        } else {
            __syncwarp();
            if ((tid & 31) == 0) mbar_arrive(&sm.empty[st]);
        }
    }
    out[blockIdx.x * kConsumers + tid] = acc;
}

}  // namespace

int main(int argc, char** argv) {
    const bool all = argc > 1 && std::strcmp(argv[1], "all") == 0;
    const int iters = argc > 2 ? std::atoi(argv[2]) : 200000;
    const int blocks = 132;
    float *src, *out;
    CK(cudaMalloc(&src, 64 * kWords * 4));
    CK(cudaMalloc(&out, blocks * kConsumers * 4));
    std::vector<float> h(64 * kWords);
    for (size_t i = 0; i < h.size(); ++i) h[i] = float(i % 7);
    CK(cudaMemcpy(src, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    auto launch = [&] {
        if (all)
            pipeline<true><<<blocks, 288>>>(src, out, iters);
        else
            pipeline<false><<<blocks, 288>>>(src, out, iters);
    };
    launch();
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    // Every consumer thread's sum is known: buf word w of iteration i is (i%64*128 + w) % 7.
    std::vector<float> got(blocks * kConsumers);
    CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int t = 0; t < kConsumers; ++t) {
        double want = 0;
        for (int i = 0; i < iters; ++i) want += float(((i & 63) * kWords + (t & (kWords - 1))) % 7) + float(i & 1);
        for (int blk = 0; blk < blocks; ++blk) bad += std::fabs(got[blk * kConsumers + t] - want) > 1e-3 * want + 1;
    }
    std::printf("m6 release=%s iters=%d: %.1f ns per stage hand-off, %s (%d of %d sums off)\n", all ? "all" : "warp",
                iters, ms * 1e6 / iters, bad ? "FAIL" : "PASS", bad, blocks * kConsumers);
    return bad ? 1 : 0;
}
