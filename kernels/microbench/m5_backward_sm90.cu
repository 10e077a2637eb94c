// M5: the sm_90a KV-outer backward main kernel (attention/backward_sm90.cuh) against the verified
// v1 deterministic backward (msa_attn_backward_dq + msa_attn_backward_dkv) on the same inputs:
// every element of dQ, dK, dV compared (relative L2 and cosine), then device-timed medians and
// useful TFLOP/s (MSA's model: 2.5 x the forward's). The physical CSR and the work items are
// built on the host; the device item build (run order included) is checked against the host rule
// word for word. The timed sm_90a path: zero dQ, item build, zero the split-row slots, the main
// kernel, the dK/dV finisher and the dQ cast (delta excluded, as for v1).
//
//   m5_backward_sm90 [iters]
// M5_DQ_COMPRESSIBLE=1: the fp32 dQ accumulator in compressible memory (microbench/vmm.cuh, M8).
#include "microbench/common.cuh"
#include "microbench/vmm.cuh"
#include "msa/attention.h"
#include "attention/backward_items.cuh"
#include "attention/backward_sm90.cuh"

namespace {

// prepare's physical CSR: per (group, physical block) the packed queries that selected it,
// ascending, with the keys of the block each sees (low 8 bits).
struct PhysCsr {
    std::vector<int> row_ptr, q, valid;
};

PhysCsr phys_csr(const HostLayout& h, const std::vector<int>& topk) {
    PhysCsr c;
    const size_t per = size_t(h.T) * 16;
    c.row_ptr.assign(size_t(4) * (h.P + 1), 0);
    c.q.assign(4 * per, -1);
    c.valid.assign(4 * per, -1);
    for (int g = 0; g < 4; ++g) {
        std::vector<std::vector<std::pair<int, int>>> rows(h.P);
        for (int t = 0; t < h.T; ++t) {
            const int p = h.pos[t], base = h.phys_base_of_q[t];
            const int klen = h.cu_k[h.qfrag[t] + 1] - h.cu_k[h.qfrag[t]];
            const int nb = (klen + 127) / 128;
            for (int s = 0; s < 16; ++s) {
                const int e = topk[(size_t(g) * h.T + t) * 16 + s];
                if (e < 0 || e >= nb || e > p / 128) continue;
                const int pb = base + e;
                const int vis = std::max(0, std::min(p - 128 * e + 1, h.bcount[pb]));
                rows[pb].push_back({t, vis});
            }
        }
        int at = 0;
        for (int pb = 0; pb < h.P; ++pb) {
            c.row_ptr[size_t(g) * (h.P + 1) + pb] = at;
            for (auto [t, vis] : rows[pb]) {
                c.q[g * per + at] = t;
                c.valid[g * per + at] = vis;
                ++at;
            }
        }
        c.row_ptr[size_t(g) * (h.P + 1) + h.P] = at;
    }
    return c;
}

// The host rule of the device item build (msa_plan::backward::kv_items): each (group, block) row
// cut into chunks of at most `chunk` entries; a row cut into several gets a dK/dV slot.
struct Items {
    std::vector<int4> items;
    std::vector<int> split_slot, split_part;
    int slots = 0;
};

// The items in the kernel's claim order for `grid` CTAs (attention/backward_items.cuh): by band
// (head, first query's 32nd of T), ties by id, except the last in the stable longest-first order
// whose tiles reach grid times half the longest item's (common/lpt_order.cuh: claim_order), which go to
// the end longest first.
Items work_items(const HostLayout& h, const PhysCsr& c, int chunk, int grid) {
    Items w;
    std::vector<int4> rows;
    w.split_slot.assign(size_t(4) * h.P, -1);
    w.split_part.assign(size_t(4) * h.P, -1);
    int parts = 0;
    for (int g = 0; g < 4; ++g)
        for (int pb = 0; pb < h.P; ++pb) {
            const int lo = c.row_ptr[size_t(g) * (h.P + 1) + pb], hi = c.row_ptr[size_t(g) * (h.P + 1) + pb + 1];
            if (hi - lo > chunk) {
                w.split_slot[size_t(g) * h.P + pb] = w.slots++;
                w.split_part[size_t(g) * h.P + pb] = parts;
                parts += (hi - lo + chunk - 1) / chunk;
            }
            for (int e = lo; e < hi; e += chunk) rows.push_back(make_int4(g, pb, e, std::min(hi, e + chunk)));
        }
    std::vector<int> ids(rows.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int(i);
    auto tiles = [&](int i) { return std::min((rows[i].w - rows[i].z + 3) / 4, msa::kLptBins - 1); };
    auto band = [&](int i) {
        const int q = std::min(std::max(c.q[size_t(rows[i].x) * h.T * 16 + rows[i].z], 0), h.T - 1);
        return rows[i].x * msa::kItemQueryBands + int(int64_t(q) * msa::kItemQueryBands / h.T);
    };
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return band(a) < band(b); });
    std::vector<int> by_cost = ids;
    std::stable_sort(by_cost.begin(), by_cost.end(), [&](int a, int b) { return tiles(a) > tiles(b); });
    const int64_t need = by_cost.empty() ? 0 : int64_t(grid) * tiles(by_cost[0]) / 2;
    size_t tail = 0;
    for (int64_t mass = 0; tail < by_cost.size() && mass < need; ++tail)
        mass += tiles(by_cost[by_cost.size() - 1 - tail]);
    std::vector<char> in_tail(rows.size(), 0);
    for (size_t j = by_cost.size() - tail; j < by_cost.size(); ++j) in_tail[by_cost[j]] = 1;
    for (int id : ids)
        if (!in_tail[id]) w.items.push_back(rows[id]);
    for (size_t j = by_cost.size() - tail; j < by_cost.size(); ++j) w.items.push_back(rows[by_cost[j]]);
    return w;
}

struct Compare {
    double rel_l2, cosine, max_abs;
};

Compare compare(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    double dd = 0, bb = 0, aa = 0, ab = 0, mx = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double x = bf2f(a[i]), y = bf2f(b[i]);
        dd += (x - y) * (x - y);
        bb += y * y;
        aa += x * x;
        ab += x * y;
        if (!std::isfinite(x)) mx = INFINITY;
        mx = std::max(mx, std::fabs(x - y));
    }
    return Compare{std::sqrt(dd / std::max(bb, 1e-30)), ab / std::sqrt(std::max(aa * bb, 1e-30)), mx};
}

template <class T>
std::vector<T> download(const T* d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

}  // namespace

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bool all_ok = true;
    const char* comp_env = std::getenv("M5_DQ_COMPRESSIBLE");
    const bool comp = comp_env != nullptr && comp_env[0] == '1';
    std::printf("M5 dQ accumulator: %s\n", comp ? "compressible (vmm)" : "cudaMalloc");
    std::printf("%-20s %7s %9s %9s %9s %9s %9s %10s %10s %10s\n", "case", "items", "v1det_ms", "sm90_ms", "main_ms",
                "v1det_TF", "sm90_TF", "dq_relL2", "dk_relL2", "dv_relL2");
    for (const Case& c : standard_cases()) {
        const HostLayout h = build(c);
        const size_t nq = size_t(h.T) * 64 * 128, nk = size_t(h.Tk) * 4 * 128;
        uint16_t *q, *k, *v, *dout, *out, *dq_ref, *dk_ref, *dv_ref, *dq, *dk, *dv;
        float *lse, *delta, *dq_acc, *dkv_acc;
        for (uint16_t** b : {&q, &dout, &out, &dq_ref, &dq}) CK(cudaMalloc(b, nq * 2));
        for (uint16_t** b : {&k, &v, &dk_ref, &dv_ref, &dk, &dv}) CK(cudaMalloc(b, nk * 2));
        CK(cudaMalloc(&lse, size_t(h.T) * 64 * 4));
        CK(cudaMalloc(&delta, size_t(h.T) * 64 * 4));
        vmm::Buffer dq_vmm;
        if (comp) {
            dq_vmm = vmm::alloc(nq * 4, true);
            if (!dq_vmm.compressed) std::printf("  compression not granted\n");
            dq_acc = static_cast<float*>(dq_vmm.ptr);
        } else {
            CK(cudaMalloc(&dq_acc, nq * 4));
        }
        fill_random(q, nq, 11, 1.7f);
        fill_random(k, nk, 12, 1.7f);
        fill_random(v, nk, 13, 1.7f);
        fill_random(dout, nq, 14, 1.0f);
        const std::vector<int> topk_h = c.random ? random_selection(h) : recent16(h);
        const PhysCsr csr = phys_csr(h, topk_h);
        const int cap = 4 * h.P + (4 * h.T * 16 + msa::kKvItemQueries - 1) / msa::kKvItemQueries;
        const int grid = msa::bwd90::backward_grid(cap, sms);
        const Items w = work_items(h, csr, msa::kKvItemQueries, grid);
        const std::vector<int4>& items_h = w.items;
        const size_t acc = size_t(std::max(4 * h.T * 16 / (msa::kKvItemQueries + 1), 1)) * 2 * 128 * 128;
        CK(cudaMalloc(&dkv_acc, acc * 4));
        int4 *items, *rows;
        int *split_slot, *split_part, *counts, *by_band, *rank;
        CK(cudaMalloc(&items, size_t(cap) * 16));
        CK(cudaMalloc(&rows, size_t(cap) * 16));
        CK(cudaMalloc(&by_band, size_t(cap) * 4));
        CK(cudaMalloc(&rank, size_t(cap) * 4));
        CK(cudaMalloc(&split_slot, size_t(4) * h.P * 4));
        CK(cudaMalloc(&split_part, size_t(4) * h.P * 4));
        CK(cudaMalloc(&counts, msa::kCountWords * 4));
        int* topk = upload(topk_h);
        int* row_ptr = upload(csr.row_ptr);
        int* qidx = upload(csr.q);
        int* valid = upload(csr.valid);
        auto build_items = [&] {
            msa::backward_items_kernel<<<1, msa::kItemBuildThreads>>>(row_ptr, qidx, h.P, h.T, cap, grid, rows, items,
                                                                        split_slot, split_part, counts, by_band, rank);
            CK(cudaGetLastError());
        };
        // The device item build equals the host rule word for word.
        build_items();
        CK(cudaDeviceSynchronize());
        {
            const std::vector<int4> di = download(items, cap);
            const std::vector<int> ds = download(split_slot, size_t(4) * h.P), dc = download(counts, msa::kCountWords);
            const std::vector<int> dp = download(split_part, size_t(4) * h.P);
            bool same = dc[0] == int(items_h.size()) && dc[1] == w.slots && ds == w.split_slot && dp == w.split_part;
            for (int i = 2; i < msa::kGroupFirstWord; ++i) same = same && dc[i] == 0;
            for (int g = 0; g < msa::kGroups; ++g) {  // each group's first claim index
                int first = int(items_h.size());
                for (int i = int(items_h.size()) - 1; i >= 0; --i)
                    if (items_h[i].x == g) first = i;
                same = same && dc[msa::kGroupFirstWord + g] == first;
            }
            for (int i = 0; i < cap && same; ++i) {
                const int4 want = i < int(items_h.size()) ? items_h[i] : make_int4(0, 0, 0, 0);
                same = di[i].x == want.x && di[i].y == want.y && di[i].z == want.z && di[i].w == want.w;
            }
            if (!same) std::printf("  %s: device items differ from the host rule\n", c.name.c_str());
            all_ok = all_ok && same;
        }
        const MsaVarlen vl = device_varlen(h);

        MsaAttnFwdParams fp{};
        fp.q = q;
        fp.k = k;
        fp.v = v;
        fp.topk = topk;
        fp.varlen = vl;
        fp.out = out;
        fp.lse = lse;
        fp.force_sm80 = 1;
        CK(cudaError_t(msa_attn_forward(&fp, nullptr)));
        CK(cudaError_t(msa_attn_backward_preprocess(out, dout, h.T, delta, nullptr)));
        MsaAttnBwdParams bp{};
        bp.q = q;
        bp.k = k;
        bp.v = v;
        bp.dout = dout;
        bp.lse = lse;
        bp.delta = delta;
        bp.varlen = vl;
        bp.topk = topk;
        bp.dq = dq_ref;
        bp.phys_row_ptr = row_ptr;
        bp.phys_q_indices = qidx;
        bp.phys_valid = valid;
        bp.dk = dk_ref;
        bp.dv = dv_ref;
        auto run_v1 = [&] {
            CK(cudaError_t(msa_attn_backward_dq(&bp, nullptr)));
            CK(cudaError_t(msa_attn_backward_dkv(&bp, nullptr)));
        };
        const msa::bwd90::Params prm{items,     counts, counts + 2, counts + 3, counts + 4, counts + msa::kGroupFirstWord,
                                     qidx,      valid,  lse,        delta,      split_slot, row_ptr,
                                     vl,        dq_acc, dkv_acc,    dk,         dv};
        auto run_main = [&] {  // the counters restart (the item build zeroes them in run_sm90)
            CK(cudaMemsetAsync(counts + 2, 0, (msa::kGroupFirstWord - 2) * 4));
            CK(msa::bwd90::launch_backward<false>(q, k, v, dout, prm, cap, sms, nullptr));
        };
        auto run_sm90 = [&] {
            build_items();
            msa::bwd90::backward_zero_slots_kernel<<<4 * sms, 256>>>(counts, reinterpret_cast<float4*>(dkv_acc));
            run_main();
            const unsigned n_finish = msa::bwd90::finish_ctas(h.P);
            msa::bwd90::backward_epilogue_kernel<<<n_finish + msa::bwd90::dq_cast_ctas(h.T), msa::bwd90::kCastThreads>>>(
                row_ptr, split_slot, nullptr, dkv_acc, vl, false, dk, dv, n_finish, dq_acc, dq);
            CK(cudaGetLastError());
        };

        run_v1();
        bool ok = true;
        Compare cq{}, ck{}, cv{};
        {
            for (uint16_t* b : {dq, dk, dv}) CK(cudaMemset(b, 0xFF, (b == dq ? nq : nk) * 2));  // NaN poison
            CK(cudaMemset(dq_acc, 0x7F, nq * 4));  // ~3.4e38: a chunk the zeroing misses shows
            run_sm90();
            CK(cudaDeviceSynchronize());
            cq = compare(download(dq, nq), download(dq_ref, nq));
            ck = compare(download(dk, nk), download(dk_ref, nk));
            cv = compare(download(dv, nk), download(dv_ref, nk));
            for (const Compare& x : {cq, ck, cv})
                ok = ok && std::isfinite(x.max_abs) && x.rel_l2 <= 1e-2 && x.cosine >= 0.9999;
        }
        all_ok = all_ok && ok;

        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        auto timed = [&](int variant) {
            CK(cudaEventRecord(e0));
            if (variant == 0) run_v1();
            if (variant == 1) run_sm90();
            if (variant == 2) run_main();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            return m;
        };
        std::vector<float> samples[3];
        for (int i = 0; i < 3; ++i)
            for (int vr = 0; vr < 3; ++vr) timed(vr);
        for (int i = 0; i < iters; ++i)
            for (int vr = 0; vr < 3; ++vr) samples[vr].push_back(timed(vr));
        const double useful = 2.5 * 4.0 * 128 * 64 * sparse_elements(h);
        const float t_v1 = median(samples[0]), t_sm90 = median(samples[1]), t_main = median(samples[2]);
        std::printf("%-20s %7zu %9.3f %9.3f %9.3f %9.1f %9.1f %10.2e %10.2e %10.2e %s (cos %.7f %.7f %.7f)\n",
                    c.name.c_str(), items_h.size(), t_v1, t_sm90, t_main, useful / t_v1 / 1e9, useful / t_sm90 / 1e9,
                    cq.rel_l2, ck.rel_l2, cv.rel_l2, ok ? "ok" : "MISMATCH", cq.cosine, ck.cosine, cv.cosine);
        for (void* b : std::initializer_list<void*>{q, k, v, dout, out, dq_ref, dk_ref, dv_ref, dq, dk, dv, lse, delta,
                                                    dkv_acc, split_slot, split_part, counts, topk, row_ptr, qidx, valid, items,
                                                    rows, by_band, rank})
            CK(cudaFree(b));
        if (comp)
            vmm::release(dq_vmm);
        else
            CK(cudaFree(dq_acc));
    }
    std::printf("M5 correctness: %s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
