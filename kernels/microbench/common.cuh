// Host and fill helpers shared by the attention microbenchmarks: synthetic packed layouts with the
// device arrays of MsaVarlen, recent16 and random selections, MSA's FLOP model, error checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "msa/common.h"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                       \
        }                                                                                       \
    } while (0)


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

inline float bf2f(uint16_t b) {
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

inline HostLayout build(const Case& c) {
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
inline double sparse_elements(const HostLayout& h) {
    double s = 0;
    for (int p : h.pos) s += std::min(p + 1, 1920 + p % 128 + 1);
    return s;
}

inline std::vector<int> recent16(const HostLayout& h) {
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
inline std::vector<int> random_selection(const HostLayout& h) {
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
inline T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    CK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

inline float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}


inline MsaVarlen device_varlen(const HostLayout& h) {
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
    return vl;
}

// The layouts every microbenchmark runs: dense-equivalent documents, one long document, a late
// CP rank of a 189,440-token document, short documents, odd lengths, and random selections.
inline std::vector<Case> standard_cases() {
    std::vector<Case> cases;
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
    return cases;
}

inline void fill_random(uint16_t* x, size_t n, uint32_t seed, float amp) {
    fill_bf16<<<1024, 256>>>(x, n, seed, amp);
    CK(cudaGetLastError());
}
