//! `prepare` on the device against the host planner, word for word: the top-k error word, the
//! k2q CSR (row_ptr, q_indices, qsplit, split_counts), the work list (scheduler_metadata,
//! work_count; exact because both sides order items head, row, chunk), the physical CSR and the
//! per-fragment schedule arrays. Every output buffer is poisoned first, so an element the
//! kernels forgot shows up as the poison word in a mismatch.

use std::sync::Arc;

use half::bf16;
use msa::cuda::{CudaMsa, DeviceLayout, Metadata, Poison};
use msa::MsaError;
use msa_harness::check::{compare, CheckLine, CheckReport};
use msa_plan::schedule::{
    balanced_target_q_per_cta, build_work_items, flat_schedule_capacity, WorkItem, WorkTable,
    WORK_WORDS,
};
use msa_plan::topology::{NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::{
    build_k2q_csr, build_physical_csr, topk_error_word, validate_topk, K2qCsr, PhysicalCsr,
    VarlenLayout,
};
use serde_json::json;

use crate::harness::{self, SelectionGroup};

/// Everything the host planner builds for one selection.
pub struct HostMetadata {
    pub word: [i32; 4],
    pub csr: K2qCsr,
    pub phys: PhysicalCsr,
    pub items: Vec<WorkItem>,
    pub table: WorkTable,
    pub target: usize,
}

/// The host tables of `topk` with the device's chunk size (`num_sms` SMs).
pub fn host_metadata(layout: &VarlenLayout, topk: &[i32], num_sms: usize) -> HostMetadata {
    let t = layout.total_q();
    let target = balanced_target_q_per_cta(t, num_sms);
    let capacity = flat_schedule_capacity(layout.total_rows(), t, target);
    let csr = build_k2q_csr(layout, topk).expect("host k2q CSR");
    let items = build_work_items(layout, &csr, target).expect("host work items");
    let table = WorkTable::new(&items, capacity).expect("host work table");
    HostMetadata {
        word: topk_error_word(layout, topk).expect("host error word"),
        phys: build_physical_csr(layout, topk).expect("host physical CSR"),
        csr,
        items,
        table,
        target,
    }
}

/// Row-major coordinates of flat index `i` in `shape`.
fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for (c, &d) in out.iter_mut().zip(shape).rev() {
        *c = i % d.max(1);
        i /= d.max(1);
    }
    out
}

/// `compare::exact`, with the first mismatches located in `shape` coordinates and poison words
/// (elements no kernel wrote) named.
pub fn exact(tensor: &str, actual: &[i32], expected: &[i32], shape: &[usize]) -> CheckLine {
    let mut line = compare::exact(tensor, actual, expected);
    if !line.passed {
        let poison = <i32 as Poison>::WORD as i32;
        let unwritten = actual.iter().filter(|&&a| a == poison).count();
        let first: Vec<String> = actual
            .iter()
            .zip(expected)
            .enumerate()
            .filter(|(_, (a, e))| a != e)
            .take(4)
            .map(|(i, (a, e))| format!("{:?}: {a} vs {e}", coords(i, shape)))
            .collect();
        line.detail = format!(
            "shape {shape:?}, lengths {} vs {}, {unwritten} poison (unwritten); first: {}",
            actual.len(),
            expected.len(),
            first.join("; ")
        );
    }
    line
}

/// Download a device tensor (panics with the tensor's name on a driver error).
pub fn fetch<T>(msa: &CudaMsa, name: &str, buf: &cudarc::driver::CudaSlice<T>) -> Vec<T>
where
    T: cudarc::driver::DeviceRepr + Default + Clone,
{
    msa.download(buf)
        .unwrap_or_else(|e| panic!("download {name}: {e}"))
}

/// Lines comparing what the validation writes (the error word, the edge counts and the sizes)
/// with the host's, names prefixed with `prefix/`.
pub fn compare_validation(
    msa: &CudaMsa,
    meta: &Metadata,
    host: &HostMetadata,
    prefix: &str,
) -> CheckReport {
    let t = meta.layout().host().total_q();
    let name = |tensor: &str| format!("{prefix}/{tensor}");
    let mut r = CheckReport::default();
    let scalars = [meta.target_q_per_cta() as i32, meta.work_capacity() as i32];
    r.push(exact(
        &name("target,capacity"),
        &scalars,
        &[host.target as i32, host.table.capacity as i32],
        &[2],
    ));
    r.push(exact(
        &name("error_word"),
        &fetch(msa, "error_word", meta.error_word()),
        &host.word,
        &[4],
    ));
    r.push(exact(
        &name("split_counts"),
        &fetch(msa, "split_counts", meta.split_counts()),
        &host.csr.split_counts,
        &[t, NUM_INDEX_HEADS],
    ));
    r
}

/// Lines comparing every metadata tensor with the host's, names prefixed with `prefix/`.
pub fn compare_metadata(
    msa: &CudaMsa,
    meta: &Metadata,
    host: &HostMetadata,
    prefix: &str,
) -> CheckReport {
    let layout = meta.layout().host();
    let (t, rows, blocks) = (
        layout.total_q(),
        layout.total_rows(),
        layout.padded_kv_blocks(),
    );
    let edges = [NUM_INDEX_HEADS, t * TOPK_BLOCKS];
    let name = |tensor: &str| format!("{prefix}/{tensor}");
    let mut r = compare_validation(msa, meta, host, prefix);
    let tables = meta
        .tables("compare_metadata")
        .expect("the metadata's tables");
    let fetched = |tensor: &str, buf| fetch(msa, tensor, buf);
    r.push(exact(
        &name("row_ptr"),
        &fetched("row_ptr", tables.row_ptr()),
        &host.csr.row_ptr,
        &[NUM_INDEX_HEADS, rows + 1],
    ));
    r.push(exact(
        &name("q_indices"),
        &fetched("q_indices", tables.q_indices()),
        &host.csr.q_indices,
        &edges,
    ));
    r.push(exact(
        &name("qsplit"),
        &fetched("qsplit", tables.qsplit()),
        &host.csr.qsplit,
        &edges,
    ));
    r.push(exact(
        &name("sched_metadata"),
        &fetched("scheduler_metadata", tables.scheduler_metadata()),
        &host.table.scheduler_metadata,
        &[host.table.capacity, WORK_WORDS],
    ));
    r.push(exact(
        &name("work_count"),
        &fetched("work_count", tables.work_count()),
        &[host.table.work_count],
        &[1],
    ));
    r.push(exact(
        &name("phys_row_ptr"),
        &fetched("phys_row_ptr", tables.phys_row_ptr()),
        &host.phys.row_ptr,
        &[NUM_INDEX_HEADS, blocks + 1],
    ));
    r.push(exact(
        &name("phys_q_indices"),
        &fetched("phys_q_indices", tables.phys_q_indices()),
        &host.phys.q_indices,
        &edges,
    ));
    r.push(exact(
        &name("phys_valid"),
        &fetched("phys_valid", tables.phys_valid()),
        &host.phys.valid,
        &edges,
    ));
    let frags = layout.fragments();
    let ws: Vec<i32> = frags.iter().map(|f| f.workspace_start() as i32).collect();
    let qoff: Vec<i32> = frags.iter().map(|f| f.query_offset() as i32).collect();
    r.push(exact(
        &name("doc_ws_starts"),
        &fetched(
            "document_workspace_starts",
            tables.document_workspace_starts(),
        ),
        &ws,
        &[frags.len()],
    ));
    r.push(exact(
        &name("query_offsets"),
        &fetched("query_offsets", tables.query_offsets()),
        &qoff,
        &[frags.len()],
    ));
    r
}

/// A sweep over many cases: every case is recorded (JSON included) and the test fails once at
/// the end, naming every failed case, so one run diagnoses all of them.
pub struct Sweep {
    test: &'static str,
    cases: usize,
    failed: Vec<String>,
}

impl Sweep {
    pub fn new(test: &'static str) -> Self {
        Self {
            test,
            cases: 0,
            failed: Vec::new(),
        }
    }

    pub fn record(&mut self, case: &str, report: &CheckReport, extra: serde_json::Value) {
        harness::record_soft(self.test, case, report, extra);
        self.cases += 1;
        if !report.passed() {
            self.failed.push(case.to_string());
        }
    }

    /// Panics (fails the test) when any case failed.
    pub fn finish(self) {
        assert!(
            self.failed.is_empty(),
            "[{}] {} of {} cases failed: {:?}",
            self.test,
            self.failed.len(),
            self.cases,
            self.failed
        );
    }
}

/// Upload a layout for the device.
pub fn device_layout(msa: &CudaMsa, layout: &VarlenLayout) -> Arc<DeviceLayout> {
    Arc::new(DeviceLayout::new(msa, layout.clone()).expect("upload layout"))
}

/// Unchecked device prepare of `topk` (panics on a launch error).
pub fn device_metadata(msa: &CudaMsa, layout: &Arc<DeviceLayout>, topk: &[i32]) -> Metadata {
    let topk = msa.upload(topk).expect("upload topk");
    msa.prepare_unchecked(layout, topk)
        .unwrap_or_else(|e| panic!("prepare_unchecked: {e}"))
}

/// The forward's metadata of `topk` (validation only; on the suite's device its outputs are
/// poisoned first, so an element the validation leaves unwritten fails the comparison).
pub fn forward_metadata(msa: &CudaMsa, layout: &Arc<DeviceLayout>, topk: &[i32]) -> Metadata {
    let topk = msa.upload(topk).expect("upload topk");
    msa.prepare_forward_unchecked(layout, topk)
        .unwrap_or_else(|e| panic!("prepare_forward_unchecked: {e}"))
}

/// The split path on `topk` against the host: the validation alone writes the error word and
/// the edge counts and no tables; `build_tables` then adds tables equal to the host's.
fn check_split(
    msa: &CudaMsa,
    dl: &Arc<DeviceLayout>,
    topk: &[i32],
    host: &HostMetadata,
    prefix: &str,
) -> CheckReport {
    let mut meta = forward_metadata(msa, dl, topk);
    let mut r = compare_validation(msa, &meta, host, &format!("{prefix}/validate"));
    let refused = matches!(
        meta.tables("backward"),
        Err(MsaError::NoTables { op: "backward" })
    );
    r_push(
        &mut r,
        format!("{prefix}/validate/no_tables"),
        refused && !meta.has_tables(),
        "the forward's metadata has tables".into(),
    );
    msa.build_tables(&mut meta)
        .unwrap_or_else(|e| panic!("build_tables: {e}"));
    r.extend(compare_metadata(
        msa,
        &meta,
        host,
        &format!("{prefix}/tables"),
    ));
    r
}

/// Prepare every selection of `group` on the device, whole and split, and record the
/// comparisons.
fn check_group(sweep: &mut Sweep, msa: &CudaMsa, group: &SelectionGroup) {
    let sms = msa.device().sm_count as usize;
    let dl = device_layout(msa, &group.layout);
    let mut report = CheckReport::default();
    let mut work_items = Vec::new();
    for (selection, topk) in &group.selections {
        let meta = device_metadata(msa, &dl, topk);
        let host = host_metadata(&group.layout, topk, sms);
        work_items.push(json!({ selection.as_str(): host.items.len() }));
        report.extend(compare_metadata(msa, &meta, &host, selection));
        report.extend(check_split(msa, &dl, topk, &host, selection));
    }
    let l = &group.layout;
    sweep.record(
        &group.name,
        &report,
        json!({
            "total_q": l.total_q(), "batch": l.batch(), "total_rows": l.total_rows(),
            "padded_kv_blocks": l.padded_kv_blocks(), "sms": sms, "work_items": work_items,
        }),
    );
}

#[test]
fn prepare_matches_the_planner_on_dev_cases() {
    let msa = harness::device();
    let mut sweep = Sweep::new("prepare_dev_cases");
    for group in harness::dev_selection_groups(|_| vec![0, 15]) {
        check_group(&mut sweep, msa, &group);
    }
    sweep.finish();
}

#[test]
fn prepare_matches_the_planner_on_edge_layouts() {
    let msa = harness::device();
    let mut sweep = Sweep::new("prepare_edge_layouts");
    for group in harness::edge_selection_groups() {
        check_group(&mut sweep, msa, &group);
    }
    sweep.finish();
}

/// A two-fragment document (positions 96..128 and 224..256, sharing block 0), a 6-token
/// document and a 300-token one: fragments 0 and 2 have 1 block, fragment 1 has 2 (own block 1),
/// fragment 3 has 3, so its early queries have existing blocks after their own.
fn fault_layout() -> VarlenLayout {
    VarlenLayout::new(
        &[0, 32, 64, 70, 370],
        &[0, 128, 256, 262, 562],
        Some(&[0, 0, 2, 3]),
    )
    .unwrap()
}

#[test]
fn prepare_reports_each_topk_fault_like_the_planner() {
    let msa = harness::device();
    let l = fault_layout();
    let t = l.total_q();
    let at = |head: usize, query: usize, slot: usize| (head * t + query) * TOPK_BLOCKS + slot;
    let base = msa_plan::testing::recent_topk(&l);
    // (name, edits): each selection's first fault has the named code; later faults must not win.
    let cases: Vec<(&str, Vec<(usize, i32)>)> = vec![
        ("valid", vec![]),
        ("negative", vec![(at(0, 5, 2), -2), (at(3, 69, 15), 7)]),
        ("out_of_range", vec![(at(1, 31, 4), 1), (at(2, 0, 0), -3)]),
        // Query 80: fragment 3, position 10, own block 0 of 3.
        ("non_causal", vec![(at(2, 80, 9), 2), (at(2, 80, 10), 9)]),
        // Query 40 (fragment 1, own block 1, recent slots [0, 1]): block 0 again in slot 1.
        ("duplicate", vec![(at(3, 40, 1), 0), (at(3, 40, 7), 0)]),
        ("duplicate_late_slot", vec![(at(3, 300, 15), 0)]),
        ("out_of_range_frag2", vec![(at(0, 66, 3), 1)]),
        (
            "earliest_head_wins",
            vec![(at(1, 69, 0), 5), (at(0, 68, 15), 1)],
        ),
        (
            "earliest_slot_wins",
            vec![(at(0, 50, 3), -7), (at(0, 50, 2), 2)],
        ),
    ];
    let dl = device_layout(msa, &l);
    let sms = msa.device().sm_count as usize;
    let mut sweep = Sweep::new("prepare_topk_faults");
    for (name, edits) in cases {
        let mut topk = base.clone();
        for &(i, v) in &edits {
            topk[i] = v;
        }
        let host_err = validate_topk(&l, &topk).err();
        let mut report = CheckReport::default();
        // The unchecked build still equals the host's tables, faults included: edges are the
        // entries 0 <= e < num_blocks on both sides (non-causal ones too; a repeat once).
        let meta = device_metadata(msa, &dl, &topk);
        let host = host_metadata(&l, &topk, sms);
        report.extend(compare_metadata(msa, &meta, &host, name));
        report.extend(check_split(msa, &dl, &topk, &host, name));
        let late = meta.check(msa).err();
        let checked = msa.prepare(&dl, msa.upload(&topk).unwrap()).err();
        let forward_late = forward_metadata(msa, &dl, &topk).check(msa).err();
        let forward = msa.prepare_forward(&dl, msa.upload(&topk).unwrap()).err();
        for (what, got) in [
            ("check", late),
            ("prepare", checked),
            ("forward_check", forward_late),
            ("prepare_forward", forward),
        ] {
            let same = match (&got, &host_err) {
                (None, None) => true,
                (Some(MsaError::Plan(d)), Some(h)) => d == h,
                _ => false,
            };
            r_push(
                &mut report,
                format!("{name}/{what}_error"),
                same,
                format!("device {got:?}, host {host_err:?}"),
            );
        }
        sweep.record(
            name,
            &report,
            json!({ "host_error": host_err.map(|e| e.to_string()) }),
        );
    }
    sweep.finish();
}

/// A pass/fail line for a non-numeric comparison.
fn r_push(report: &mut CheckReport, tensor: String, passed: bool, detail: String) {
    report.push(CheckLine {
        tensor,
        metric: "equal",
        value: if passed { 0.0 } else { 1.0 },
        limit: 0.0,
        passed,
        detail: if passed { String::new() } else { detail },
    });
}

#[test]
fn prepare_rejects_a_wrong_topk_length_before_any_launch() {
    let msa = harness::device();
    let l = fault_layout();
    let dl = device_layout(msa, &l);
    let short = msa.upload(&vec![-1i32; 4 * l.total_q() * 16 - 1]).unwrap();
    let err = msa.prepare_unchecked(&dl, short).err();
    let ok = matches!(
        &err,
        Some(MsaError::Tensor {
            name: "topk_indices",
            ..
        })
    );
    let mut report = CheckReport::default();
    r_push(
        &mut report,
        "topk_length".into(),
        ok,
        format!("got {err:?}"),
    );
    harness::record("prepare_topk_length", "short_by_one", &report, json!({}));
}

/// The backward, its task build and the KL backward on the forward's metadata (validation only)
/// return `MsaError::NoTables` naming themselves, before any launch; after `build_tables` the
/// backward runs.
#[test]
fn the_forward_metadata_needs_its_tables_for_the_backward() {
    use msa::cuda::{BackwardOptions, KlInputs};
    use msa_plan::topology::{HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS};
    let msa = harness::device();
    let l = fault_layout();
    let (t, tk) = (l.total_q(), l.total_k());
    let dl = device_layout(msa, &l);
    let mut meta = forward_metadata(msa, &dl, &msa_plan::testing::recent_topk(&l));
    let q = msa.zeros::<bf16>(t * NUM_Q_HEADS * HEAD_DIM).unwrap();
    let kv = msa.zeros::<bf16>(tk * NUM_KV_HEADS * HEAD_DIM).unwrap();
    let lse = msa.zeros::<f32>(t * NUM_Q_HEADS).unwrap();
    let qi = msa.zeros::<bf16>(t * NUM_INDEX_HEADS * HEAD_DIM).unwrap();
    let ki = msa.zeros::<bf16>(tk * HEAD_DIM).unwrap();
    let ilse = msa.zeros::<f32>(t * NUM_INDEX_HEADS).unwrap();
    let backward = |meta: &Metadata| {
        msa.backward(meta, &q, &kv, &kv, &q, &q, &lse, BackwardOptions::default())
    };
    let kl = msa.kl_backward(
        &meta,
        &KlInputs {
            q: &q,
            k: &kv,
            teacher_lse: &lse,
            qi: &qi,
            ki: &ki,
            indexer_lse: &ilse,
        },
        1.0,
    );
    let mut report = CheckReport::default();
    for (op, err) in [
        ("backward", backward(&meta).err()),
        ("task_build", msa.task_build(&meta).err()),
        ("kl_backward", kl.err()),
    ] {
        let refused = matches!(&err, Some(MsaError::NoTables { op: o }) if *o == op);
        r_push(&mut report, op.into(), refused, format!("got {err:?}"));
    }
    msa.build_tables(&mut meta).expect("build_tables");
    let after = backward(&meta).err();
    r_push(
        &mut report,
        "backward_after_tables".into(),
        after.is_none(),
        format!("got {after:?}"),
    );
    harness::record("prepare_forward_tables", "fault_layout", &report, json!({}));
}

#[test]
fn prepare_unchecked_captures_into_a_cuda_graph() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    // A private device handle: a failed capture must not leave the suite's stream capturing.
    let msa = harness::open_device();
    let group = harness::edge_selection_groups()
        .find(|g| g.name == "cp_fragments")
        .expect("cp_fragments layout");
    let (selection, topk) = &group.selections[1];
    let dl = device_layout(&msa, &group.layout);
    let host = host_metadata(&group.layout, topk, msa.device().sm_count as usize);
    let mut report = CheckReport::default();
    // The whole prepare, and the split path (validation, then the tables) in one graph.
    for split in [false, true] {
        let upload = msa.upload(topk).unwrap();
        msa.synchronize().unwrap();
        let stream = msa.stream().clone();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .expect("begin capture");
        let built = if split {
            msa.prepare_forward_unchecked(&dl, upload)
                .and_then(|mut m| msa.build_tables(&mut m).map(|()| m))
        } else {
            msa.prepare_unchecked(&dl, upload)
        };
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        let prefix = format!("{selection}/{}", if split { "split" } else { "whole" });
        match (built, graph) {
            (Ok(meta), Ok(Some(graph))) => {
                graph.launch().expect("graph launch");
                report.extend(compare_metadata(&msa, &meta, &host, &prefix));
            }
            (built, graph) => r_push(
                &mut report,
                format!("{prefix}/capture"),
                false,
                format!(
                    "prepare under capture: {:?}; end_capture: {:?}",
                    built.err(),
                    graph.map(|g| g.is_some())
                ),
            ),
        }
    }
    harness::record("prepare_graph_capture", &group.name, &report, json!({}));
}

/// The layout arrays `DeviceLayout` derives on the device (`msa_prepare_layout` through
/// `msa::raw::build_layout`, from the uploaded cu_seqlens and fragment_indices only) against
/// `msa_plan::VarlenLayout`'s, word for word: `fragment_first [B]`, `query_fragment [T]`,
/// `block_key_start`, `block_key_count [P]`. Outputs are poisoned first.
fn layout_report(msa: &CudaMsa, layout: &VarlenLayout) -> CheckReport {
    let dl = device_layout(msa, layout);
    let (start, count) = layout.physical_block_keys();
    let (b, t, p) = (layout.batch(), layout.total_q(), layout.padded_kv_blocks());
    let mut r = CheckReport::default();
    // An empty tensor is a 1-element allocation in the facade: compare the first `n` words.
    let head = |v: Vec<i32>, n: usize| v[..n.min(v.len())].to_vec();
    r.push(exact(
        "fragment_first",
        &head(fetch(msa, "fragment_first", dl.fragment_first()), b),
        &layout.fragment_first(),
        &[b],
    ));
    r.push(exact(
        "query_fragment",
        &head(fetch(msa, "query_fragment", dl.query_fragment()), t),
        &layout.query_fragments(),
        &[t],
    ));
    r.push(exact(
        "block_key_start",
        &head(fetch(msa, "block_key_start", dl.block_key_start()), p),
        &start,
        &[p],
    ));
    r.push(exact(
        "block_key_count",
        &head(fetch(msa, "block_key_count", dl.block_key_count()), p),
        &count,
        &[p],
    ));
    r
}

/// Every CP16 rank of every dev case, as `(case<id>/r<rank>, layout)`, built lazily.
pub fn dev_layouts() -> impl Iterator<Item = (String, VarlenLayout)> {
    use msa_workloads::{parse_manifest, CpConfig};
    const DEV_MANIFEST_TEXT: &str = include_str!("../../data/cases/cp16_192k_dev.jsonl");
    let cases = parse_manifest(DEV_MANIFEST_TEXT).expect("the embedded dev manifest parses");
    cases.into_iter().flat_map(|case| {
        let ranks = case.rank_cases(&CpConfig::default()).expect("CP16 split");
        ranks.into_iter().map(|rc| {
            (
                format!("case{}/r{}", rc.case_id(), rc.rank()),
                rc.layout().clone(),
            )
        })
    })
}

#[test]
fn layout_arrays_match_the_planner_on_edge_layouts_and_dev_cases() {
    let msa = harness::device();
    let mut sweep = Sweep::new("layout_arrays");
    let mut layouts = harness::edge_layouts();
    // Two documents split into fragments that share blocks: two fragments of equal length,
    // then a document whose last fragment has keys but no queries.
    layouts.push((
        "shared_blocks_uneven".into(),
        VarlenLayout::new(
            &[0, 10, 20, 30, 40, 40],
            &[0, 130, 300, 300, 520, 900],
            Some(&[0, 0, 0, 3, 3]),
        )
        .unwrap(),
    ));
    for (name, layout) in layouts {
        let extra =
            json!({ "T": layout.total_q(), "B": layout.batch(), "P": layout.padded_kv_blocks() });
        sweep.record(&name, &layout_report(msa, &layout), extra);
    }
    for (name, layout) in dev_layouts() {
        let extra =
            json!({ "T": layout.total_q(), "B": layout.batch(), "P": layout.padded_kv_blocks() });
        sweep.record(&name, &layout_report(msa, &layout), extra);
    }
    sweep.finish();
}
