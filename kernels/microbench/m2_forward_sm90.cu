// M2: the sm_90a shared-selection forward (attention/forward_sm90.cuh through msa_attn_forward)
// on recent16 selections, against the verified v1 kernel (force_sm80) on the same inputs: every
// element of O and LSE compared, then device-timed medians of both and useful TFLOP/s under MSA's
// FLOP model, and the raw rate over the tile unions (counted here on the host).
// docs/perf/attention-forward-sm90.md records what this run decided.
//
//   m2_forward_sm90 [iters]
#include "microbench/common.cuh"
#include "msa/attention.h"

#include <set>

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);

    const std::vector<Case> cases = standard_cases();

    bool all_ok = true;
    std::printf("%-20s %8s %8s %9s %9s %9s %9s %9s %7s %10s %10s\n", "case", "T", "items", "union", "v1_ms", "sm90_ms",
                "v1_TF", "sm90_TF", "raw_TF", "max|dO|", "max|dLSE|");
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
        fill_random(q, nq, 1, 1.7f);
        fill_random(k, nk, 2, 1.7f);
        fill_random(v, nk, 3, 1.7f);
        const std::vector<int> topk_h = c.random ? random_selection(h) : recent16(h);
        int* topk = upload(topk_h);
        const MsaVarlen vl = device_varlen(h);

        const int tiles = (h.T + 7) / 8;
        size_t ws_bytes = 0;
        CK(static_cast<cudaError_t>(msa_attn_forward_workspace_bytes(vl, &ws_bytes)));
        void* ws;
        CK(cudaMalloc(&ws, ws_bytes));

        MsaAttnFwdParams v1p{};
        v1p.q = q;
        v1p.k = k;
        v1p.v = v;
        v1p.topk = topk;
        v1p.varlen = vl;
        v1p.out = o_ref;
        v1p.lse = lse_ref;
        v1p.force_sm80 = 1;
        MsaAttnFwdParams f1p = v1p;
        f1p.out = o;
        f1p.lse = lse;
        f1p.workspace = ws;
        f1p.workspace_bytes = ws_bytes;
        f1p.force_sm80 = 0;
        auto run_v1 = [&] { CK(static_cast<cudaError_t>(msa_attn_forward(&v1p, nullptr))); };
        auto run_f1 = [&] { CK(static_cast<cudaError_t>(msa_attn_forward(&f1p, nullptr))); };

        run_v1();
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> oref(nq);
        std::vector<float> lref(size_t(h.T) * 64);
        CK(cudaMemcpy(oref.data(), o_ref, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lref.data(), lse_ref, lref.size() * 4, cudaMemcpyDeviceToHost));

        double max_do = 0, max_dl = 0;
        bool ok = true;
        {
            fill_u32<<<1024, 256>>>(reinterpret_cast<uint32_t*>(o), nq / 2, 0xFFC1FFC1u);
            fill_u32<<<1024, 256>>>(reinterpret_cast<uint32_t*>(lse), size_t(h.T) * 64, 0x7FC00BADu);
            run_f1();
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
                std::printf("  %s: %zu elements differ from v1\n", c.name.c_str(), bad);
                ok = false;
            }
        }
        all_ok = all_ok && ok;

        // Each (group, tile)'s union of the physical blocks its queries selected (the kernel's work).
        double union_sum = 0;
        for (int g = 0; g < 4; ++g)
            for (int tile = 0; tile < tiles; ++tile) {
                std::set<int> blocks;
                for (int t = tile * 8; t < std::min(h.T, tile * 8 + 8); ++t)
                    for (int s = 0; s < 16; ++s) {
                        const int e = topk_h[(size_t(g) * h.T + t) * 16 + s];
                        if (e >= 0 && e <= h.pos[t] / 128) blocks.insert(h.phys_base_of_q[t] + e);
                    }
                union_sum += double(blocks.size());
            }

        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        // Variants timed round-robin (v1, sm_90a), so clock and power drift hit them alike.
        auto timed = [&](int variant) {
            CK(cudaEventRecord(e0));
            if (variant == 0) {
                run_v1();
            } else {
                run_f1();
            }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            return m;
        };
        std::vector<float> samples[2];
        for (int i = 0; i < 3; ++i)
            for (int v = 0; v < 2; ++v) timed(v);
        for (int i = 0; i < iters; ++i)
            for (int v = 0; v < 2; ++v) samples[v].push_back(timed(v));
        const float t_v1 = median(samples[0]), t_f1 = median(samples[1]);
        const double useful = 4.0 * 128 * 64 * sparse_elements(h);
        const double raw = union_sum * 128.0 * 128 * 128 * 4;  // computed: 128 rows x 128 keys x 2 GEMMs
        std::printf("%-20s %8d %8d %9.2f %9.3f %9.3f %9.1f %9.1f %7.1f %10.2e %10.2e %s\n", c.name.c_str(), h.T,
                    4 * tiles, union_sum / (4.0 * tiles), t_v1, t_f1, useful / t_v1 / 1e9, useful / t_f1 / 1e9,
                    raw / t_f1 / 1e9, max_do, max_dl, ok ? "ok" : "MISMATCH");
        CK(cudaFree(q));
        CK(cudaFree(k));
        CK(cudaFree(v));
        CK(cudaFree(o));
        CK(cudaFree(o_ref));
        CK(cudaFree(lse));
        CK(cudaFree(lse_ref));
        CK(cudaFree(topk));
        CK(cudaFree(ws));
    }
    std::printf("M2 correctness: %s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
