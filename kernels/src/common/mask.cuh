// Key masks on mma accumulator fragments. A warp's 16 rows are the 16 heads of one query, so the
// visible-key limit is uniform over the rows and only the column (key) index matters: accumulator
// element (nt, e) of lane (g, t) holds key key0 + 8 nt + 2 t + (e & 1), rows g (e < 2) and g + 8.
#pragma once

#include <cmath>

#include "common/constants.cuh"

namespace msa {

__device__ __forceinline__ int frag_col(int nt, int e) {
    return 8 * nt + 2 * (threadIdx.x & 3) + (e & 1);
}

// Scores of keys >= n_visible become -inf, so a row max ignores them and ex2 maps them to 0.
template <int NT>
__device__ __forceinline__ void mask_keys(float (&s)[NT][4], int key0, int n_visible) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (key0 + frag_col(nt, e) >= n_visible) s[nt][e] = -INFINITY;
}

// The same with a limit per accumulator row, for tiles whose 16 rows belong to different
// queries: row g (e < 2) keeps keys < n_visible_lo, row g + 8 (e >= 2) keys < n_visible_hi.
template <int NT>
__device__ __forceinline__ void mask_keys_rows(float (&s)[NT][4], int key0, int n_visible_lo, int n_visible_hi) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (key0 + frag_col(nt, e) >= (e < 2 ? n_visible_lo : n_visible_hi)) s[nt][e] = -INFINITY;
}

}  // namespace msa
