// Prepare, host side: the sizes of one call, the CUB temporary storage and the carve of the
// workspace, shared by msa_prepare_workspace_bytes and msa_prepare_metadata so they always agree.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/launch.cuh"
#include "prepare/prepare_common.cuh"

namespace msa {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Bits that hold every key in [0, sentinel]: the radix sort skips the zero high bits.
int key_bits(unsigned sentinel) {
    int bits = 1;
    while (bits < 32 && (sentinel >> bits) != 0u) ++bits;
    return bits;
}

struct Plan {
    // Sizes.
    int n_edges;  // 64 * T (kEdgesPerQuery per query)
    int k2q_keys;  // 4R: sentinel and scan length - 1
    int phys_keys; // 4P
    // Byte offsets into the workspace.
    size_t fault, row_offsets, row_map, row_frag, row_level;
    size_t k2q_counts, k2q_offsets, chunk_counts, work_offsets, phys_counts, phys_offsets;
    size_t k2q_keys_a, k2q_vals_a, phys_keys_a, phys_vals_a, keys_b, vals_b;
    size_t temp, temp_bytes, total;
};

struct Carver {
    size_t at = 0;
    template <typename T>
    size_t take(size_t count) {
        const size_t here = at;
        at = align_up(at + count * sizeof(T));
        return here;
    }
};

// Checks the sizes, asks CUB for its temporary storage and lays the workspace out; the same
// function serves msa_prepare_workspace_bytes and the launcher, so they always agree.
cudaError_t make_plan(const MsaVarlen& v, Plan* p) {
    const long long t = v.total_q, r = v.total_rows, pb = v.padded_kv_blocks, b = v.batch;
    if (t < 0 || r < 0 || pb < 1 || b < 1 || kEdgesPerQuery * t > INT32_MAX || kIndexHeads * (r + 1) > INT32_MAX ||
        kIndexHeads * (pb + 1) > INT32_MAX || (t > 0 && r < 1)) {
        return cudaErrorInvalidValue;
    }
    p->n_edges = int(kEdgesPerQuery * t);
    p->k2q_keys = int(kIndexHeads * r);
    p->phys_keys = int(kIndexHeads * pb);
    const size_t n = size_t(p->n_edges);
    Carver c;
    p->fault = c.take<unsigned long long>(1);
    p->row_offsets = c.take<int>(size_t(b) + 1);
    p->row_map = c.take<int>(size_t(r));
    p->row_frag = c.take<int>(size_t(r));
    p->row_level = c.take<int>(size_t(r));
    p->k2q_counts = c.take<int>(size_t(p->k2q_keys) + 1);
    p->k2q_offsets = c.take<int>(size_t(p->k2q_keys) + 1);
    p->chunk_counts = c.take<int>(size_t(p->k2q_keys) + 1);
    p->work_offsets = c.take<int>(size_t(p->k2q_keys) + 1);
    p->phys_counts = c.take<int>(size_t(p->phys_keys) + 1);
    p->phys_offsets = c.take<int>(size_t(p->phys_keys) + 1);
    p->k2q_keys_a = c.take<unsigned>(n);
    p->k2q_vals_a = c.take<unsigned>(n);
    p->phys_keys_a = c.take<unsigned>(n);
    p->phys_vals_a = c.take<unsigned long long>(n);
    // The second buffers of both double-buffered sorts (the k2q sort runs first and its result
    // is scattered before the physical sort reuses them).
    p->keys_b = c.take<unsigned>(n);
    p->vals_b = c.take<unsigned long long>(n);
    p->temp = c.at;

    size_t temp = 0, bytes = 0;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int*>(nullptr),
                                          static_cast<int*>(nullptr), p->k2q_keys + 1));
    temp = bytes > temp ? bytes : temp;
    MSA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int*>(nullptr),
                                          static_cast<int*>(nullptr), p->phys_keys + 1));
    temp = bytes > temp ? bytes : temp;
    if (p->n_edges > 0) {
        cub::DoubleBuffer<unsigned> keys(nullptr, nullptr);
        cub::DoubleBuffer<unsigned> vals32(nullptr, nullptr);
        cub::DoubleBuffer<unsigned long long> vals64(nullptr, nullptr);
        MSA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals32, p->n_edges, 0,
                                                key_bits(unsigned(p->k2q_keys))));
        temp = bytes > temp ? bytes : temp;
        MSA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals64, p->n_edges, 0,
                                                key_bits(unsigned(p->phys_keys))));
        temp = bytes > temp ? bytes : temp;
    }
    p->temp_bytes = temp;
    // kAlign bytes of slack: the launcher aligns the workspace base up, so any allocation works.
    p->total = align_up(p->temp + temp) + kAlign;
    return cudaSuccess;
}

unsigned grid_for(long long items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace
}  // namespace msa
