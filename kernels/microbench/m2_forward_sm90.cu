// M2: the sm_90a shared-selection forward (attention/forward_sm90.cuh) on recent16 selections,
// against the verified v1 kernel (msa_attn_forward) on the same inputs: every element of O and
// LSE compared, then device-timed medians of both and useful TFLOP/s under MSA's FLOP model.
// docs/perf/attention-forward-sm90.md records what this run decided.
//
//   m2_forward_sm90 [iters]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "msa/attention.h"
#include "attention/forward_sm90.cuh"
#include "attention/tile_union.cuh"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                       \
        }                                                                                       \
    } while (0)

namespace {

__global__ void fill_bf16(uint16_t* x, size_t n, uint32_t seed, float amp) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t h = uint32_t(i) * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        h *= 3266489917u;
        h ^= h >> 16;
        const float u = (h >> 8) * (1.f / 16777216.f) * 2.f - 1.f;
        const __nv_bfloat16 b = __float2bfloat16_rn(u * amp);
        x[i] = *reinterpret_cast<const uint16_t*>(&b);
    }
}

__global__ void fill_u32(uint32_t* x, size_t n, uint32_t v) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) x[i] = v;
}

float bf2f(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

struct Case {
    std::string name;
    std::vector<int> cu_q, cu_k;
    bool random = false;  // 15 random earlier blocks + the own block, else recent16
};

struct HostLayout {
    std::vector<int> cu_q, cu_k, first, qfrag, bstart, bcount;
    int T, Tk, B, rows, P, max_blocks;
    std::vector<int> pos, phys_base_of_q;
};

HostLayout build(const Case& c) {
    HostLayout h;
    h.cu_q = c.cu_q;
    h.cu_k = c.cu_k;
    h.B = int(c.cu_q.size()) - 1;
    h.T = c.cu_q.back();
    h.Tk = c.cu_k.back();
    h.P = (h.Tk + (h.B + 1) * 128 - 1) / 128;
    h.bstart.assign(h.P, -1);
    h.bcount.assign(h.P, 0);
    h.rows = 0;
    h.max_blocks = 0;
    for (int b = 0; b < h.B; ++b) {
        h.first.push_back(b);
        const int klen = h.cu_k[b + 1] - h.cu_k[b], qlen = h.cu_q[b + 1] - h.cu_q[b];
        const int nb = (klen + 127) / 128;
        h.rows += nb;
        h.max_blocks = std::max(h.max_blocks, nb);
        const int base = (h.cu_k[b] + b * 128) / 128;
        for (int j = 0; j < nb; ++j) {
            h.bstart[base + j] = h.cu_k[b] + 128 * j;
            h.bcount[base + j] = std::min(128, klen - 128 * j);
        }
        for (int i = 0; i < qlen; ++i) {
            h.qfrag.push_back(b);
            h.pos.push_back(klen - qlen + i);
            h.phys_base_of_q.push_back(base);
        }
    }
    return h;
}

// MSA's sparse_elements: sum over queries of min(p + 1, 1920 + p % 128 + 1).
double sparse_elements(const HostLayout& h) {
    double s = 0;
    for (int p : h.pos) s += std::min(p + 1, 1920 + p % 128 + 1);
    return s;
}

std::vector<int> recent16(const HostLayout& h) {
    std::vector<int> topk(size_t(4) * h.T * 16, -1);
    for (int g = 0; g < 4; ++g)
        for (int t = 0; t < h.T; ++t) {
            const int b = h.pos[t] / 128;
            int* row = &topk[(size_t(g) * h.T + t) * 16];
            for (int s = 0; s < 15; ++s) row[s] = b - 15 + s >= 0 ? b - 15 + s : -1;
            row[15] = b;
        }
    return topk;
}

// Each (group, query): its own block and up to 15 distinct earlier blocks drawn at random.
std::vector<int> random_selection(const HostLayout& h) {
    std::vector<int> topk(size_t(4) * h.T * 16, -1);
    uint64_t state = 0x2545F4914F6CDD1Dull;
    auto next = [&] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state;
    };
    for (int g = 0; g < 4; ++g)
        for (int t = 0; t < h.T; ++t) {
            const int b = h.pos[t] / 128;
            int* row = &topk[(size_t(g) * h.T + t) * 16];
            const int want = std::min(15, b);
            int n = 0;
            while (n < want) {
                const int c = int(next() % uint64_t(b));
                if (std::find(row, row + n, c) == row + n) row[n++] = c;
            }
            row[15] = b;
        }
    return topk;
}

template <class T>
T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    CK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);

    std::vector<Case> cases;
    {
        Case c{"6x2048", {}, {}};
        for (int i = 0; i <= 6; ++i) c.cu_q.push_back(2048 * i);
        c.cu_k = c.cu_q;
        cases.push_back(c);
        cases.push_back(Case{"1x12288", {0, 12288}, {0, 12288}});
        cases.push_back(Case{"late12288of189440", {0, 12288}, {0, 189440}});
        Case s{"24x512", {}, {}};
        for (int i = 0; i <= 24; ++i) s.cu_q.push_back(512 * i);
        s.cu_k = s.cu_q;
        cases.push_back(s);
        // Odd document lengths: tiles straddle documents and 128-blocks.
        Case o{"odd", {0}, {0}};
        const int lens[] = {1, 1000, 2049, 129, 3001, 77, 5003, 955};
        for (int L : lens) {
            o.cu_q.push_back(o.cu_q.back() + L);
            o.cu_k.push_back(o.cu_k.back() + L);
        }
        cases.push_back(o);
        Case r{"random_late", {0, 12288}, {0, 189440}};
        r.random = true;
        cases.push_back(r);
    }

    bool all_ok = true;
    std::printf("%-20s %8s %8s %9s %9s %9s %9s %9s %9s %9s %7s %10s %10s\n", "case", "T", "items", "union", "v1_ms",
                "serial_ms", "stream_ms", "v1_TF", "serial_TF", "stream_TF", "raw_TF", "max|dO|", "max|dLSE|");
    for (const Case& c : cases) {
        const HostLayout h = build(c);
        const size_t nq = size_t(h.T) * 64 * 128, nk = size_t(h.Tk) * 4 * 128;
        uint16_t *q, *k, *v, *o_ref, *o;
        float *lse_ref, *lse;
        CK(cudaMalloc(&q, nq * 2));
        CK(cudaMalloc(&k, nk * 2));
        CK(cudaMalloc(&v, nk * 2));
        CK(cudaMalloc(&o_ref, nq * 2));
        CK(cudaMalloc(&o, nq * 2));
        CK(cudaMalloc(&lse_ref, size_t(h.T) * 64 * 4));
        CK(cudaMalloc(&lse, size_t(h.T) * 64 * 4));
        fill_bf16<<<1024, 256>>>(q, nq, 1, 1.7f);
        fill_bf16<<<1024, 256>>>(k, nk, 2, 1.7f);
        fill_bf16<<<1024, 256>>>(v, nk, 3, 1.7f);
        const std::vector<int> topk_h = c.random ? random_selection(h) : recent16(h);
        int* topk = upload(topk_h);
        MsaVarlen vl{};
        vl.cu_seqlens_q = upload(h.cu_q);
        vl.cu_seqlens_k = upload(h.cu_k);
        vl.fragment_first = upload(h.first);
        vl.query_fragment = upload(h.qfrag);
        vl.block_key_start = upload(h.bstart);
        vl.block_key_count = upload(h.bcount);
        vl.batch = h.B;
        vl.total_q = h.T;
        vl.total_k = h.Tk;
        vl.total_rows = h.rows;
        vl.padded_kv_blocks = h.P;
        vl.max_blocks = h.max_blocks;

        const int tiles = (h.T + 7) / 8;
        int *counts, *wpos;
        int4* entries;
        CK(cudaMalloc(&counts, size_t(4) * tiles * 4));
        CK(cudaMalloc(&wpos, size_t(h.T) * 4));
        CK(cudaMalloc(&entries, size_t(4) * tiles * 128 * 16));
        msa::fwd90::Params prm{counts, entries, wpos, vl, o, lse, tiles, 128};

        auto run_v1 = [&] { CK(static_cast<cudaError_t>(msa_attn_forward(q, k, v, topk, vl, o_ref, lse_ref, nullptr))); };
        using msa::fwd90::Schedule;
        auto run_f1 = [&](int schedule) {
            msa::tile_union_kernel<<<dim3(tiles, 4), msa::kTileUnionThreads>>>(topk, vl, counts, entries, wpos);
            CK(cudaGetLastError());
            CK(schedule == 0 ? msa::fwd90::launch_forward<Schedule::kSerial>(q, k, v, prm, sms, nullptr)
                             : msa::fwd90::launch_forward<Schedule::kStream>(q, k, v, prm, sms, nullptr));
        };

        run_v1();
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> oref(nq);
        std::vector<float> lref(size_t(h.T) * 64);
        CK(cudaMemcpy(oref.data(), o_ref, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lref.data(), lse_ref, lref.size() * 4, cudaMemcpyDeviceToHost));

        double max_do = 0, max_dl = 0;
        bool ok = true;
        for (int schedule = 0; schedule < 2; ++schedule) {
            fill_u32<<<1024, 256>>>(reinterpret_cast<uint32_t*>(o), nq / 2, 0xFFC1FFC1u);
            fill_u32<<<1024, 256>>>(reinterpret_cast<uint32_t*>(lse), size_t(h.T) * 64, 0x7FC00BADu);
            run_f1(schedule);
            CK(cudaDeviceSynchronize());
            std::vector<uint16_t> of(nq);
            std::vector<float> lf(lref.size());
            CK(cudaMemcpy(of.data(), o, nq * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(lf.data(), lse, lf.size() * 4, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t i = 0; i < nq; ++i) {
                const float a = bf2f(of[i]), b = bf2f(oref[i]);
                const double d = std::fabs(double(a) - b);
                if (!(d <= 2e-2 + 2e-2 * std::fabs(b))) ++bad;
                if (std::isfinite(d)) max_do = std::max(max_do, d);
            }
            for (size_t i = 0; i < lf.size(); ++i) {
                const double d = (std::isinf(lf[i]) && std::isinf(lref[i]) && lf[i] == lref[i]) ? 0 : std::fabs(double(lf[i]) - lref[i]);
                if (!(d <= 1e-3)) ++bad;
                if (std::isfinite(d)) max_dl = std::max(max_dl, d);
            }
            if (bad) {
                std::printf("  %s schedule %d: %zu elements differ from v1\n", c.name.c_str(), schedule, bad);
                ok = false;
            }
        }
        all_ok = all_ok && ok;

        std::vector<int> cnt(size_t(4) * tiles);
        CK(cudaMemcpy(cnt.data(), counts, cnt.size() * 4, cudaMemcpyDeviceToHost));
        double union_sum = 0;
        for (int u : cnt) union_sum += u;

        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        // Variants timed round-robin (v1, serial, stream), so clock and power drift hit them alike.
        auto timed = [&](int variant) {
            CK(cudaEventRecord(e0));
            if (variant == 0) {
                run_v1();
            } else {
                run_f1(variant - 1);
            }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            return m;
        };
        std::vector<float> samples[3];
        for (int i = 0; i < 3; ++i)
            for (int v = 0; v < 3; ++v) timed(v);
        for (int i = 0; i < iters; ++i)
            for (int v = 0; v < 3; ++v) samples[v].push_back(timed(v));
        const float t_v1 = median(samples[0]), t_f1 = median(samples[1]), t_ov = median(samples[2]);
        const double useful = 4.0 * 128 * 64 * sparse_elements(h);
        const double raw = union_sum * 128.0 * 128 * 128 * 4;  // computed: 128 rows x 128 keys x 2 GEMMs
        std::printf("%-20s %8d %8d %9.2f %9.3f %9.3f %9.3f %9.1f %9.1f %9.1f %7.1f %10.2e %10.2e %s\n",
                    c.name.c_str(), h.T, 4 * tiles, union_sum / (4.0 * tiles), t_v1, t_f1, t_ov,
                    useful / t_v1 / 1e9, useful / t_f1 / 1e9, useful / t_ov / 1e9,
                    raw / t_ov / 1e9, max_do, max_dl, ok ? "ok" : "MISMATCH");
        CK(cudaFree(q));
        CK(cudaFree(k));
        CK(cudaFree(v));
        CK(cudaFree(o));
        CK(cudaFree(o_ref));
        CK(cudaFree(lse));
        CK(cudaFree(lse_ref));
        CK(cudaFree(topk));
        CK(cudaFree(counts));
        CK(cudaFree(entries));
        CK(cudaFree(wpos));
    }
    std::printf("M2 correctness: %s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
