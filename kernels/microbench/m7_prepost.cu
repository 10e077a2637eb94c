// M7: the backward's HBM-bound passes at T = 12,288 (every development row's size), each in several
// forms, to decide whether any of them can beat the rates the pre/post share was measured at
// (run 64: delta 93.5 us = 4.2 TB/s over O and dO, the dq_accum memset 95.8 us = 4.2 TB/s, the
// epilogue's cast 135 us = 4.4 TB/s over 576 MiB).
//   delta/cur     the preprocess as shipped (one (t, h) row per half warp, 16-byte loads)
//   delta/gs<R>   persistent grid-stride, R rows' loads in flight per half warp before the sums
//   zero/memset   cudaMemsetAsync of the fp32 accumulator
//   zero/v4<C>    persistent grid-stride 16-byte stores, C CTAs of 256 threads per SM
//   zero/bulk     cp.async.bulk stores of a zeroed 32 KiB shared buffer, one CTA per SM
//   fused/cur     delta/cur that also zeroes its rows' 512-byte accumulator rows
//   fused/gs2     delta/gs2 with the same zeroing
//   cast          the accumulator (fp32) to dQ (bf16), 8 floats per thread
// Each form is timed by events over 20 launches after 3 warm-ups (median of 5 such batches).
#include "common.cuh"
#include "common/intrinsics.cuh"

namespace {

using msa::bf16_hi;
using msa::bf16_lo;

constexpr int kT = 12288, kHeads = 64, kD = 128;
constexpr long long kRows = 1LL * kT * kHeads;

__device__ __forceinline__ float dot8(uint4 o, uint4 g) {
    float a = bf16_lo(o.x) * bf16_lo(g.x);
    a = fmaf(bf16_hi(o.x), bf16_hi(g.x), a);
    a = fmaf(bf16_lo(o.y), bf16_lo(g.y), a);
    a = fmaf(bf16_hi(o.y), bf16_hi(g.y), a);
    a = fmaf(bf16_lo(o.z), bf16_lo(g.z), a);
    a = fmaf(bf16_hi(o.z), bf16_hi(g.z), a);
    a = fmaf(bf16_lo(o.w), bf16_lo(g.w), a);
    return fmaf(bf16_hi(o.w), bf16_hi(g.w), a);
}

__device__ __forceinline__ float half_warp_sum(float a) {
#pragma unroll
    for (int off = 8; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off, 16);
    return a;
}

// kZero: also clears the row's 512-byte accumulator row (two 16-byte stores per lane).
template <bool kZero>
__global__ void __launch_bounds__(256) delta_cur(const uint16_t* __restrict__ o, const uint16_t* __restrict__ g,
                                                 float* __restrict__ delta, float4* __restrict__ acc) {
    const long long row = blockIdx.x * 16LL + threadIdx.x / 16;
    const int part = threadIdx.x % 16;
    const size_t at = size_t(row) * kD + part * 8;
    const float a = half_warp_sum(dot8(*reinterpret_cast<const uint4*>(o + at), *reinterpret_cast<const uint4*>(g + at)));
    if (kZero) {
        acc[size_t(row) * 32 + part] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[size_t(row) * 32 + 16 + part] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (part == 0) delta[row] = a;
}

template <int R, bool kZero>
__global__ void __launch_bounds__(256) delta_gs(const uint16_t* __restrict__ o, const uint16_t* __restrict__ g,
                                                float* __restrict__ delta, float4* __restrict__ acc) {
    const int part = threadIdx.x % 16;
    const long long hw = blockIdx.x * 16LL + threadIdx.x / 16, stride = gridDim.x * 16LL;
    for (long long r0 = hw; r0 < kRows; r0 += stride * R) {
        uint4 ov[R], gv[R];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const long long row = r0 + i * stride;
            if (row < kRows) {
                const size_t at = size_t(row) * kD + part * 8;
                ov[i] = __ldcs(reinterpret_cast<const uint4*>(o + at));
                gv[i] = __ldcs(reinterpret_cast<const uint4*>(g + at));
            } else {
                ov[i] = gv[i] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const long long row = r0 + i * stride;
            const float a = half_warp_sum(dot8(ov[i], gv[i]));
            if (row < kRows) {
                if (kZero) {
                    acc[size_t(row) * 32 + part] = make_float4(0.f, 0.f, 0.f, 0.f);
                    acc[size_t(row) * 32 + 16 + part] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
                if (part == 0) delta[row] = a;
            }
        }
    }
}

__global__ void __launch_bounds__(256) zero_v4(float4* __restrict__ acc, long long n4) {
    const long long stride = gridDim.x * 256LL;
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n4; i += 4 * stride) {
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i + u * stride < n4) acc[i + u * stride] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

constexpr int kBulk = 32768;
__global__ void __launch_bounds__(128) zero_bulk(char* __restrict__ acc, long long bytes) {
    extern __shared__ __align__(128) float4 zbuf[];
    for (int i = threadIdx.x; i < kBulk / 16; i += blockDim.x) zbuf[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x != 0) return;
    const uint32_t src = static_cast<uint32_t>(__cvta_generic_to_shared(zbuf));
    int issued = 0;
    for (long long off = blockIdx.x * 1LL * kBulk; off < bytes; off += gridDim.x * 1LL * kBulk) {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(acc + off), "r"(src),
                     "r"(kBulk)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        if (++issued >= 16) asm volatile("cp.async.bulk.wait_group.read 15;\n" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

__global__ void __launch_bounds__(256) cast(const float4* __restrict__ acc, uint4* __restrict__ dq, long long n8) {
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n8; i += gridDim.x * 256LL) {
        const float4 a = __ldcs(acc + 2 * i), b = __ldcs(acc + 2 * i + 1);
        __nv_bfloat162 p[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                               __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
        dq[i] = *reinterpret_cast<uint4*>(p);
    }
}

template <class F>
float time_us(F&& launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) launch();
    std::vector<float> med;
    for (int batch = 0; batch < 5; ++batch) {
        CK(cudaEventRecord(a));
        for (int i = 0; i < 20; ++i) launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, a, b));
        med.push_back(ms * 1000.f / 20.f);
    }
    CK(cudaGetLastError());
    return median(med);
}

}  // namespace

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t elems = size_t(kRows) * kD;
    uint16_t *o, *g, *dq;
    float *delta, *acc;
    CK(cudaMalloc(&o, elems * 2));
    CK(cudaMalloc(&g, elems * 2));
    CK(cudaMalloc(&dq, elems * 2));
    CK(cudaMalloc(&acc, elems * 4));
    CK(cudaMalloc(&delta, kRows * 4));
    fill_random(o, elems, 1u, 0.5f);
    fill_random(g, elems, 2u, 0.5f);
    CK(cudaDeviceSynchronize());
    float4* acc4 = reinterpret_cast<float4*>(acc);
    const double in_bytes = 2.0 * elems * 2, acc_bytes = elems * 4.0;
    auto row = [](const char* name, float us, double bytes) {
        std::printf("%-14s %8.1f us  %6.3f TB/s\n", name, us, bytes / (us * 1e-6) / 1e12);
    };
    const unsigned cur_grid = unsigned(kRows / 16);
    // The reference sums for the correctness check of every delta form.
    delta_cur<false><<<cur_grid, 256>>>(o, g, delta, acc4);
    std::vector<float> ref(kRows), got(kRows);
    CK(cudaMemcpy(ref.data(), delta, kRows * 4, cudaMemcpyDeviceToHost));
    auto check = [&](const char* name) {
        CK(cudaMemcpy(got.data(), delta, kRows * 4, cudaMemcpyDeviceToHost));
        std::vector<float> z(4096);
        CK(cudaMemcpy(z.data(), acc + elems - 4096, 4096 * 4, cudaMemcpyDeviceToHost));
        long long bad = 0;
        for (long long i = 0; i < kRows; ++i) bad += got[i] != ref[i];
        for (float v : z) bad += v != 0.f;
        if (bad) std::printf("%s: %lld mismatches\n", name, bad);
        return bad == 0;
    };
    bool ok = true;
    std::printf("M7 T=%d, O+dO %.0f MiB, dq_accum %.0f MiB, %d SMs\n", kT, in_bytes / 1048576, acc_bytes / 1048576, sms);
    row("delta/cur", time_us([&] { delta_cur<false><<<cur_grid, 256>>>(o, g, delta, acc4); }), in_bytes);
    for (int c : {4, 8, 16}) {
        char n[32];
        std::snprintf(n, sizeof n, "delta/gs2x%d", c);
        row(n, time_us([&] { delta_gs<2, false><<<sms * c, 256>>>(o, g, delta, acc4); }), in_bytes);
        std::snprintf(n, sizeof n, "delta/gs4x%d", c);
        row(n, time_us([&] { delta_gs<4, false><<<sms * c, 256>>>(o, g, delta, acc4); }), in_bytes);
    }
    CK(cudaMemset(acc, 0, elems * 4));
    ok &= check("delta/gs");
    row("zero/memset", time_us([&] { CK(cudaMemsetAsync(acc, 0, elems * 4)); }), acc_bytes);
    for (int c : {2, 4, 8}) {
        char n[32];
        std::snprintf(n, sizeof n, "zero/v4x%d", c);
        row(n, time_us([&] { zero_v4<<<sms * c, 256>>>(acc4, (long long)(elems / 4)); }), acc_bytes);
    }
    CK(cudaFuncSetAttribute(zero_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulk));
    for (int c : {1, 2, 4}) {
        char n[32];
        std::snprintf(n, sizeof n, "zero/bulkx%d", c);
        row(n, time_us([&] { zero_bulk<<<sms * c, 128, kBulk>>>(reinterpret_cast<char*>(acc), (long long)(elems * 4)); }),
            acc_bytes);
    }
    row("memset+delta", time_us([&] {
            CK(cudaMemsetAsync(acc, 0, elems * 4));
            delta_cur<false><<<cur_grid, 256>>>(o, g, delta, acc4);
        }),
        in_bytes + acc_bytes);
    CK(cudaMemset(acc, 0xff, elems * 4));
    row("fused/cur", time_us([&] { delta_cur<true><<<cur_grid, 256>>>(o, g, delta, acc4); }), in_bytes + acc_bytes);
    ok &= check("fused/cur");
    for (int c : {4, 8, 16}) {
        char n[32];
        std::snprintf(n, sizeof n, "fused/gs2x%d", c);
        CK(cudaMemset(acc, 0xff, elems * 4));
        row(n, time_us([&] { delta_gs<2, true><<<sms * c, 256>>>(o, g, delta, acc4); }), in_bytes + acc_bytes);
        ok &= check(n);
    }
    for (int c : {4, 8, 16}) {
        char n[32];
        std::snprintf(n, sizeof n, "cast/x%d", c);
        row(n, time_us([&] { cast<<<sms * c, 256>>>(acc4, reinterpret_cast<uint4*>(dq), (long long)(elems / 8)); }),
            acc_bytes + elems * 2.0);
    }
    std::printf("M7 %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
