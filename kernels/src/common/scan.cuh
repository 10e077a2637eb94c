// Block-wide exclusive prefix sum of one int per thread: the primitive of the single-CTA table
// builders that lay out variable-length work (indexer query tiles, KL work items) without a host
// round trip. A shuffle scan per warp, then one warp scans the warp totals.
#pragma once

namespace msa {

template <int THREADS>
struct BlockScanSmem {
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 32 of them");
    int warp_prefix[THREADS / 32];
    int total;
};

// Returns the sum of v over threads 0 .. threadIdx.x - 1 and sets total to the sum over all
// threads. Every thread of the CTA must call it (barriers); s may be reused by the next call.
template <int THREADS>
__device__ __forceinline__ int block_exclusive_scan(BlockScanSmem<THREADS>& s, int v, int& total) {
    constexpr unsigned kFull = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(kFull, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) s.warp_prefix[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const int w = lane < THREADS / 32 ? s.warp_prefix[lane] : 0;
        int wi = w;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(kFull, wi, d);
            if (lane >= d) wi += y;
        }
        if (lane < THREADS / 32) s.warp_prefix[lane] = wi - w;
        if (lane == 31) s.total = wi;
    }
    __syncthreads();
    total = s.total;
    const int prefix = s.warp_prefix[warp] + x - v;
    __syncthreads();  // everyone has read s before the next call overwrites it
    return prefix;
}

}  // namespace msa
