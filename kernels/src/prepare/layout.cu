// Prepare family: the layout arrays of MsaVarlen derived on the device (msa_prepare_layout,
// kernels/include/msa/prepare.h) from cu_seqlens_q, cu_seqlens_k and fragment_indices, with the
// host rule of msa_plan::VarlenLayout (fragment_first, query_fragments, physical_block_keys), so
// a caller that owns the device needs no host copy of the layout. Arch-neutral.
//
// One grid-stride kernel; element i of each output is written by exactly one thread from the
// inputs alone (no atomics, no shared state), so the result is deterministic:
//   fragment_first[b]  = fragment_indices[b], or b when absent;
//   query_fragment[t]  = the last b with cu_seqlens_q[b] <= t (empty fragments are skipped),
//                        a binary search over cu_seqlens_q;
//   block_key_start/count[pb]: the document covering physical block pb is found by a binary
//                        search over phys_base(b) = (cu_k[first] + first * 128) / 128, which is
//                        nondecreasing in b and strictly increasing from one document to the
//                        next; the search lands on the document's last fragment, whose K range
//                        is the longest of the document (cu_seqlens_k is nondecreasing), so its
//                        block_keys(j) is the maximum the host takes over the document's
//                        fragments. Documents' physical ranges never overlap, so a block no
//                        document covers is padding: (-1, 0).
//
// Inputs are trusted to be a valid layout (msa_plan::VarlenLayout::new's rules); on invalid ones
// the outputs are meaningless but every read and write stays in bounds (indices are clamped).

#include "msa/prepare.h"

#include <cuda_runtime.h>

#include "common/constants.cuh"
#include "common/launch.cuh"

namespace msa {
namespace {

constexpr int kLayoutThreads = 256;
// Grid-stride cap: the arrays are at most a few million entries.
constexpr long long kLayoutMaxBlocks = 4096;

struct LayoutArgs {
    const int32_t* cu_q;  // [batch + 1]
    const int32_t* cu_k;  // [batch + 1]
    const int32_t* frag;  // [batch] or null
    int batch;
    int total_q;
    int padded_kv_blocks;
};

// The document's first fragment of fragment b, clamped into [0, b] (the valid range).
__device__ __forceinline__ int first_of(const LayoutArgs& a, int b) {
    if (a.frag == nullptr) return b;
    return min(max(a.frag[b], 0), b);
}

// Physical block of the document's block 0 for fragment b (common/varlen.cuh's phys_base).
__device__ __forceinline__ long long phys_base_of(const LayoutArgs& a, int b) {
    const int first = first_of(a, b);
    return (static_cast<long long>(a.cu_k[first]) + static_cast<long long>(first) * kBlock) / kBlock;
}

__global__ void __launch_bounds__(kLayoutThreads) layout_kernel(LayoutArgs a, MsaLayoutOutputs out) {
    const long long n = max(max(static_cast<long long>(a.total_q), static_cast<long long>(a.padded_kv_blocks)),
                            static_cast<long long>(a.batch));
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (i < a.batch) {
            out.fragment_first[i] = a.frag == nullptr ? static_cast<int32_t>(i) : a.frag[i];
        }
        if (i < a.total_q) {
            // partition_point(cu_q[0..=batch], c <= i) - 1.
            int lo = 0, hi = a.batch + 1;
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (a.cu_q[mid] <= i) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            out.query_fragment[i] = min(max(lo - 1, 0), a.batch - 1);
        }
        if (i < a.padded_kv_blocks) {
            // Fragments with phys_base <= i form a prefix; its last one is its document's last.
            int lo = 0, hi = a.batch;
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (phys_base_of(a, mid) <= i) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            int32_t start = -1, count = 0;
            if (lo > 0) {
                const int b = lo - 1;
                const long long k_base = a.cu_k[first_of(a, b)];
                const long long k_len = static_cast<long long>(a.cu_k[b + 1]) - k_base;
                const long long j = i - phys_base_of(a, b);
                if (j * kBlock < k_len) {
                    start = static_cast<int32_t>(k_base + j * kBlock);
                    count = static_cast<int32_t>(min(k_len - j * kBlock, static_cast<long long>(kBlock)));
                }
            }
            out.block_key_start[i] = start;
            out.block_key_count[i] = count;
        }
    }
}

cudaError_t prepare_layout(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, const int32_t* fragment_indices,
                           int32_t batch, int32_t total_q, int32_t total_k, int32_t padded_kv_blocks,
                           const MsaLayoutOutputs& out, void* stream) {
    const long long expected_blocks =
        (static_cast<long long>(total_k) + (static_cast<long long>(batch) + 1) * kBlock - 1) / kBlock;
    if (batch < 1 || total_q < 0 || total_k < 0 || padded_kv_blocks != expected_blocks ||
        cu_seqlens_q == nullptr || cu_seqlens_k == nullptr || out.fragment_first == nullptr ||
        out.block_key_start == nullptr || out.block_key_count == nullptr ||
        (total_q > 0 && out.query_fragment == nullptr)) {
        return cudaErrorInvalidValue;
    }
    LayoutArgs a;
    a.cu_q = cu_seqlens_q;
    a.cu_k = cu_seqlens_k;
    a.frag = fragment_indices;
    a.batch = batch;
    a.total_q = total_q;
    a.padded_kv_blocks = padded_kv_blocks;
    long long n = total_q > padded_kv_blocks ? total_q : padded_kv_blocks;
    n = n > batch ? n : batch;
    long long blocks = (n + kLayoutThreads - 1) / kLayoutThreads;
    blocks = blocks > kLayoutMaxBlocks ? kLayoutMaxBlocks : blocks;
    return launch(layout_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kLayoutThreads),
                  static_cast<cudaStream_t>(stream), a, out);
}

}  // namespace
}  // namespace msa

extern "C" int msa_prepare_layout(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                  const int32_t* fragment_indices, int32_t batch, int32_t total_q, int32_t total_k,
                                  int32_t padded_kv_blocks, MsaLayoutOutputs out, void* stream) {
    return msa::prepare_layout(cu_seqlens_q, cu_seqlens_k, fragment_indices, batch, total_q, total_k,
                               padded_kv_blocks, out, stream);
}
