// M2: the sm_90a shared-selection forward (attention/forward_sm90.cuh) on recent16 selections,
// against the verified v1 kernel (msa_attn_forward) on the same inputs: every element of O and
// LSE compared, then device-timed medians of both and useful TFLOP/s under MSA's FLOP model.
// docs/perf/attention-forward-sm90.md records what this run decided.
//
//   m2_forward_sm90 [iters]
#include "microbench/common.cuh"
#include "msa/attention.h"
#include "attention/forward_sm90.cuh"
#include "attention/tile_union.cuh"

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);

    const std::vector<Case> cases = standard_cases();

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
        fill_random(q, nq, 1, 1.7f);
        fill_random(k, nk, 2, 1.7f);
        fill_random(v, nk, 3, 1.7f);
        const std::vector<int> topk_h = c.random ? random_selection(h) : recent16(h);
        int* topk = upload(topk_h);
        const MsaVarlen vl = device_varlen(h);

        const int tiles = (h.T + 7) / 8;
        int *counts, *wpos;
        int4* entries;
        int2* run;
        CK(cudaMalloc(&counts, size_t(4) * tiles * 4));
        CK(cudaMalloc(&run, size_t(4) * tiles * 8));
        CK(cudaMalloc(&wpos, size_t(h.T) * 4));
        CK(cudaMalloc(&entries, size_t(4) * tiles * 128 * 16));
        msa::fwd90::Params prm{run, entries, wpos, vl, o, lse, tiles, 128};

        MsaAttnFwdParams v1p{};
        v1p.q = q;
        v1p.k = k;
        v1p.v = v;
        v1p.topk = topk;
        v1p.varlen = vl;
        v1p.out = o_ref;
        v1p.lse = lse_ref;
        v1p.force_sm80 = 1;
        auto run_v1 = [&] { CK(static_cast<cudaError_t>(msa_attn_forward(&v1p, nullptr))); };
        using msa::fwd90::Schedule;
        auto run_f1 = [&](int schedule) {
            msa::tile_union_kernel<<<dim3(tiles, 4), msa::kTileUnionThreads>>>(topk, vl, counts, entries, wpos);
            msa::tile_order_kernel<<<1, msa::kTileOrderThreads>>>(counts, 4 * tiles, msa::fwd90::forward_grid(4 * tiles, sms),
                                                                 run);
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
        CK(cudaFree(run));
        CK(cudaFree(entries));
        CK(cudaFree(wpos));
    }
    std::printf("M2 correctness: %s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
