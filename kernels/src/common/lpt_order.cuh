// Work lists of the persistent kernels whose CTAs claim items from a counter (host mirror:
// msa_plan::lpt), built by one CTA without a host round trip: a stable counting sort over
// kLptBins cost values (stable_bin_sort), so the list is the host mirror's word for word and the
// same on every run. claim_order keeps the list in a preferred order (the backward's query
// bands) except a longest-first tail of the shortest items whose costs add up to the grid times
// half the longest, which evens out the CTAs' last claims.
#pragma once

#include "msa/abi.h"
#include "common/scan.cuh"

namespace msa {

constexpr int kLptBins = MSA_LPT_BINS;  // costs 0..128; larger ones share the top bin

template <int THREADS>
struct LptSmem {
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 32 of them");
    int next[kLptBins];  // per bin: its item count, then the sorted index of its next item
    int warp_count[THREADS / 32][kLptBins];  // items of each bin per warp in the current chunk
};

__device__ __forceinline__ int lpt_bin(int cost) {
    return kLptBins - 1 - (cost < kLptBins - 1 ? cost : kLptBins - 1);  // bin 0: the largest costs
}

// Counts the n items per bin, then turns the counts into each bin's first sorted index (one warp
// scans, 5 bins a lane). Barriers inside; every thread calls it.
template <int THREADS, class Bin>
__device__ __forceinline__ void bin_offsets(LptSmem<THREADS>& s, int n, Bin bin) {
    static_assert(32 * 5 >= kLptBins, "5 bins per lane");
    for (int b = threadIdx.x; b < kLptBins; b += THREADS) s.next[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS) atomicAdd(&s.next[bin(i)], 1);
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int c[5], sum = 0;
#pragma unroll
        for (int k = 0; k < 5; ++k) {
            const int b = 5 * lane + k;
            c[k] = b < kLptBins ? s.next[b] : 0;
            sum += c[k];
        }
        int incl = sum;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += y;
        }
        int acc = incl - sum;
#pragma unroll
        for (int k = 0; k < 5; ++k) {
            const int b = 5 * lane + k;
            if (b < kLptBins) s.next[b] = acc;
            acc += c[k];
        }
    }
    __syncthreads();
}

// Stable counting sort of n items by bin(i) in [0, kLptBins): emit(i, j) is called once per item
// with its rank j in (bin, i) order. Every thread of the CTA (blockDim.x == THREADS) calls it;
// barriers inside.
template <int THREADS, class Bin, class Emit>
__device__ __forceinline__ void stable_bin_sort(LptSmem<THREADS>& s, int n, Bin bin, Emit emit) {
    constexpr int kWarps = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    bin_offsets<THREADS>(s, n, bin);
    // Stable scatter, a chunk of THREADS items at a time: an item's index within its bin counts
    // the bin's items of earlier chunks, earlier warps and earlier lanes.
    for (int chunk = 0; chunk < n; chunk += THREADS) {
        const int i = chunk + static_cast<int>(threadIdx.x);
        const bool valid = i < n;
        const int b = valid ? bin(i) : kLptBins + lane;  // a lane of its own when past n
        for (int x = threadIdx.x; x < kWarps * kLptBins; x += THREADS) (&s.warp_count[0][0])[x] = 0;
        __syncthreads();
        const unsigned same = __match_any_sync(0xffffffffu, b);
        const int below = __popc(same & ((1u << lane) - 1u));
        if (valid && below == 0) s.warp_count[warp][b] = __popc(same);
        __syncthreads();
        if (valid) {
            int j = s.next[b] + below;
            for (int w = 0; w < warp; ++w) j += s.warp_count[w][b];
            emit(i, j);
        }
        __syncthreads();
        for (int bb = threadIdx.x; bb < kLptBins; bb += THREADS) {
            int c = 0;
            for (int w = 0; w < kWarps; ++w) c += s.warp_count[w][bb];
            s.next[bb] += c;
        }
        __syncthreads();
    }
}

// The n items in their given order (index k), except a tail of those last in the stable
// longest-first order (the shortest; among equals the latest), just long enough that their costs
// reach `grid` times half the longest cost (floor), which goes to the end longest first:
// emit(k, p) once per item with its list position p. rank: n ints of scratch. Every thread of the
// CTA (blockDim.x == THREADS) calls it; barriers inside.
template <int THREADS, class Cost, class Emit>
__device__ __forceinline__ void claim_order(LptSmem<THREADS>& s, BlockScanSmem<THREADS>& scan, int n, int grid,
                                            int* rank, Cost cost, Emit emit) {
    __shared__ int head_end;
    stable_bin_sort<THREADS>(s, n, [&](int k) { return lpt_bin(cost(k)); }, [&](int k, int j) { rank[k] = j; });
    // s.next[b] is now the end of bin b in rank order (bin b: cost kLptBins - 1 - b). From the
    // cheapest bin up, the tail takes whole bins while their mass stays short of the need, then
    // as many of the next bin's last items as reach it.
    if (threadIdx.x == 0) {
        int top = 0;
        while (top < kLptBins && s.next[top] == 0) ++top;
        const long long need = top < kLptBins ? static_cast<long long>(grid) * (kLptBins - 1 - top) / 2 : 0;
        int end = n;
        long long mass = 0;
        for (int b = kLptBins - 1; b >= 0 && mass < need; --b) {
            const int begin = b > 0 ? s.next[b - 1] : 0, c = kLptBins - 1 - b;
            const long long bin_mass = static_cast<long long>(c) * (s.next[b] - begin);
            if (mass + bin_mass < need) {
                mass += bin_mass;
                end = begin;
            } else {
                end = s.next[b] - static_cast<int>((need - mass + c - 1) / c);  // c > 0: mass < need
                mass = need;
            }
        }
        head_end = end;
    }
    __syncthreads();  // rank and head_end complete
    const int head = head_end;
    int at = 0;
    for (int chunk = 0; chunk < n; chunk += THREADS) {
        const int k = chunk + static_cast<int>(threadIdx.x);
        const int j = k < n ? rank[k] : 0;
        const bool in_head = k < n && j < head;
        int total;
        const int p = at + block_exclusive_scan<THREADS>(scan, in_head ? 1 : 0, total);
        if (k < n) emit(k, in_head ? p : j);
        at += total;
    }
}

}  // namespace msa
