// Softmax pieces in the exp2 domain: scores s enter as x = s * scale * log2(e).
#pragma once

#include <cmath>

#include "common/constants.cuh"
#include "common/intrinsics.cuh"

namespace msa {

// Online softmax state of the two accumulator rows (g and g + 8) a lane holds. m is the running
// max of x; l is this lane's partial sum of 2^(x - m) (the quad is summed once, at the end).
struct OnlineSoftmax {
    float m[2];
    float l[2];

    __device__ __forceinline__ void init() {
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
    }

    // Turns the raw (masked: -inf) scores of one block into P = 2^(x - m_new) in place and
    // rescales the output accumulator by 2^(m_old - m_new). A row without any visible key so far
    // keeps m = -inf; it then uses 0 as its reference so that no -inf - -inf = NaN arises
    // (ex2(-inf) = 0 keeps P, l and acc at exactly 0).
    template <int NT, int NO>
    __device__ __forceinline__ void update(float (&s)[NT][4], float (&acc)[NO][4]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            const float m_new = fmaxf(m[r], quad_max(mx) * kScaleLog2e);
            const float m_ref = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = ex2(m[r] - m_ref);
            m[r] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; ++e) {
                    s[nt][e] = ex2(fmaf(s[nt][e], kScaleLog2e, -m_ref));
                    sum += s[nt][e];
                }
            l[r] = l[r] * alpha + sum;
#pragma unroll
            for (int nt = 0; nt < NO; ++nt) {
                acc[nt][2 * r] *= alpha;
                acc[nt][2 * r + 1] *= alpha;
            }
        }
    }
};

// The backward recomputes P = 2^(x - lse * log2(e)) from the forward's natural-log LSE. An LSE of
// -inf (empty selection) maps to +inf so that P = 2^-inf = 0 instead of 2^+inf.
__device__ __forceinline__ float lse_to_log2(float lse) {
    return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

}  // namespace msa
