/* Naive GPU references of the attention and the KL backward: TEST ORACLES, not kernels to
 * train with. fp32 on CUDA cores (no tensor cores), one CTA per output row or key block, written
 * for clarity after docs/contract.md §2 and §3 rather than for speed (like CUTLASS's
 * fmha_reference beside its kernels). They share no code with the kernels they check, take the
 * selection as is (any entry that is negative, past the query's own block or past the
 * document is ignored; repeated entries count once: set semantics) and write fp32 outputs, so
 * the GPU suite can compare EVERY element of the fast kernels' outputs with them at real scale.
 *
 * Layouts (contiguous, row-major; bf16 as uint16_t bits): q, dout, out [T, 64, 128];
 * k, v [Tk, 4, 128]; qi [T, 4, 128]; ki [Tk, 1, 128]; topk [4, T, 16] i32; lse, delta,
 * teacher_lse [T, 64] f32; indexer_lse [4, T] f32. For query t of fragment b at document
 * position p and group g = h / 16, the token set is S = {j <= p : j / 128 listed in
 * topk[g, t, :]}, keys at packed rows k_base + j (msa/common.h).
 *
 * Each launcher returns a cudaError_t code (0 = success), enqueues on `stream` and never
 * synchronizes. Outputs are written in full; rows of empty sets get zeros (and lse = -inf). */
#ifndef MSA_REFERENCE_H
#define MSA_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "msa/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[t, h] = sum_{j in S} softmax(scale <q[t, h], k[j, g]>)_j v[j, g] and
 * lse[t, h] = logsumexp_{j in S} scale <q[t, h], k[j, g]> (natural log), scale = 128^-0.5;
 * out f32 [T, 64, 128], lse f32 [T, 64]. One CTA of 128 threads per (t, h). */
int msa_reference_attention_forward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                    const int32_t* topk, MsaVarlen varlen, float* out, float* lse,
                                    void* stream);

/* Gradients of sum(dout * O) given the forward's bf16 `out` and its `lse` (as the kernels are
 * given them): delta[t, h] = sum_d dout out, P = exp(s - lse), dS = P (dout . v_j - delta),
 * dq = scale sum_j dS k_j, dk_j = scale sum_{(t, h): j in S} dS q, dv_j = sum P dout; f32
 * outputs with the shapes of q, k, v. `delta` is f32 [T, 64] scratch. dq: one CTA per (t, h);
 * dk/dv: one CTA per (physical block, group, 32 of the 128 dims), 128 threads (one per key),
 * the block's K and V in 66 KB of dynamic shared memory. Keys in no token set get zeros. */
int msa_reference_attention_backward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                     const int32_t* topk, const uint16_t* dout, const uint16_t* out,
                                     const float* lse, MsaVarlen varlen, float* delta, float* dq,
                                     float* dk, float* dv, void* stream);

/* The KL backward of the index branch (docs/contract.md §3.2): on S,
 * teacher(j) = (1/16) sum_{h in g} exp(scale <q[t, h], k[j, g]> - teacher_lse[t, h]),
 * student(j) = exp(scale <qi[t, g], ki[j]> - indexer_lse[g, t]), dz = bf16(student - teacher),
 * dqi[t, g] = grad_scale sum_j dz ki[j], dki[j] = grad_scale sum_{(t, g): j in S} dz qi[t, g],
 * grad_scale = scale * loss_coeff / (4 * max(T, 1)); f32 dqi [T, 4, 128], dki [Tk, 1, 128].
 * dqi: one CTA per (t, g); dki: one CTA per (physical block, 32 dims), 66 KB of dynamic shared
 * memory. */
int msa_reference_kl_backward(const uint16_t* q, const uint16_t* k, const float* teacher_lse,
                              const uint16_t* qi, const uint16_t* ki, const float* indexer_lse,
                              const int32_t* topk, MsaVarlen varlen, float loss_coeff, float* dqi,
                              float* dki, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MSA_REFERENCE_H */
