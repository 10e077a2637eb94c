// Prepare: the k2q and physical CSRs from the edge counts (row pointers, chunks per row) and
// from the stably sorted edges (the scatters into each head's edge slots).
#pragma once

#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

// Offsets: row_ptr[h, r] = G[h*R + r] - G[h*R] from the exclusive scan G of the per-(head, row)
// counts (G has 4R + 1 entries, so r = R reads the next head's start or the total); likewise
// for the physical CSR. chunks[h*R + r] = ceil(count / target), chunks[4R] = 0.

struct OffsetsArgs {
    const int* k2q_counts;
    const int* k2q_offsets;
    const int* phys_offsets;
    int* row_ptr;
    int* phys_row_ptr;
    int* chunk_counts;
    int target;
};

__global__ void __launch_bounds__(kThreads) offsets_kernel(MsaVarlen v, OffsetsArgs a) {
    const int R = v.total_rows;
    const int P = v.padded_kv_blocks;
    const long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (i < static_cast<long long>(kIndexHeads) * (R + 1)) {
        const int h = int(i / (R + 1));
        const int r = int(i - static_cast<long long>(h) * (R + 1));
        a.row_ptr[i] = a.k2q_offsets[h * R + r] - a.k2q_offsets[h * R];
    }
    if (i <= static_cast<long long>(kIndexHeads) * R) {
        a.chunk_counts[i] =
            i < static_cast<long long>(kIndexHeads) * R ? (a.k2q_counts[i] + a.target - 1) / a.target : 0;
    }
    if (i < static_cast<long long>(kIndexHeads) * (P + 1)) {
        const int h = int(i / (P + 1));
        const int r = int(i - static_cast<long long>(h) * (P + 1));
        a.phys_row_ptr[i] = a.phys_offsets[h * P + r] - a.phys_offsets[h * P];
    }
}

// Scatters of the sorted edges. Sorted position p of key k (head h) lands at p - G[h*rows] in
// head h's edge slots: G[h*rows] counts the edges of earlier heads, and within a head the sorted
// order is row-major with stable (query, slot) order inside a row. Sentinel keys sort last.

__global__ void __launch_bounds__(kThreads)
    scatter_k2q_kernel(const unsigned* __restrict__ keys, const unsigned* __restrict__ vals,
                       const int* __restrict__ offsets, int rows, int n, int* q_indices,
                       int* qsplit) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (thread >= n) return;
    const int p = int(thread);
    const unsigned key = keys[p];
    if (key >= unsigned(kIndexHeads * rows)) return;
    const int head = int(key) / rows;
    const size_t at = static_cast<size_t>(head) * (n / kIndexHeads) + (p - offsets[head * rows]);
    const unsigned val = vals[p];
    q_indices[at] = int(val & ((1u << kQsplitRankShift) - 1u));
    qsplit[at] = int(val);
}

__global__ void __launch_bounds__(kThreads)
    scatter_phys_kernel(const unsigned* __restrict__ keys,
                        const unsigned long long* __restrict__ vals,
                        const int* __restrict__ offsets, int blocks, int n, int* phys_q,
                        int* phys_valid) {
    const long long thread = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (thread >= n) return;
    const int p = int(thread);
    const unsigned key = keys[p];
    if (key >= unsigned(kIndexHeads * blocks)) return;
    const int head = int(key) / blocks;
    const size_t at = static_cast<size_t>(head) * (n / kIndexHeads) + (p - offsets[head * blocks]);
    const unsigned long long val = vals[p];
    phys_q[at] = int(unsigned(val >> 32));
    phys_valid[at] = int(unsigned(val & 0xffffffffull));
}

}  // namespace
}  // namespace msa
