//! The backward task build on the device against `msa_plan`'s host mirror, word for word: the
//! whole scratch image (descriptor, task ends, task segments, the four bin rows, task decode)
//! and the tables (task_meta, task_qrows, task_qpos), on schedules built by the device `prepare`
//! and on hand-made ones that force source order (flag 2), capacity overflow (flag 1), clamped
//! work counts and every walk regime.

use msa::cuda::{CudaMsa, DeviceSchedule, DeviceTaskTables};
use msa::MsaError;
use msa_harness::check::CheckReport;
use msa_plan::backward::abi::{
    BIN_ROWS, DEC_WORDS, DESC_FLAGS, DESC_WORDS, FLAG_CAPACITY_OVERFLOW,
    FLAG_NONCONTIGUOUS_SEGMENTS, META_WORDS, TASK_QUERIES,
};
use msa_plan::schedule::{build_work_items, flat_schedule_capacity, WorkItem};
use msa_plan::topology::BLOCK_SIZE;
use msa_plan::{
    build_backward_tasks, build_k2q_csr, Int32Array, MsaBackwardSchedule, ScheduleParts,
    TaskTables, VarlenLayout,
};
use serde_json::json;

use crate::harness::{self, SelectionGroup};
use crate::prepare::{
    compare_metadata, device_layout, device_metadata, exact, fetch, host_metadata, Sweep,
};

/// Lines comparing every part of the scratch and table buffers, names prefixed `prefix/`.
fn compare_tables(
    msa: &CudaMsa,
    dev: &DeviceTaskTables,
    host: &TaskTables,
    prefix: &str,
) -> CheckReport {
    let name = |part: &str| format!("{prefix}/{part}");
    let mut r = CheckReport::default();
    let (ds, hs) = (dev.sizes(), &host.sizes);
    let sizes = |s: &msa_plan::TaskBuildSizes, grid: usize| {
        [
            s.capacity,
            s.num_windows,
            s.num_kblocks,
            s.bins,
            s.scratch_words,
            s.table_words,
            grid,
        ]
        .map(|v| v as i32)
    };
    r.push(exact(
        &name("sizes,grid"),
        &sizes(ds, dev.grid_launch()),
        &sizes(hs, host.grid_launch),
        &[7],
    ));
    let scratch = fetch(msa, "scratch", dev.scratch());
    let tables = fetch(msa, "tables", dev.tables());
    let (hscratch, htables) = (host.scratch_image(), host.table_image());
    if scratch.len() != hscratch.len() || tables.len() != htables.len() {
        r.push(exact(
            &name("scratch"),
            &scratch,
            &hscratch,
            &[hscratch.len()],
        ));
        r.push(exact(&name("tables"), &tables, &htables, &[htables.len()]));
        return r;
    }
    let (cap, bins, works) = (hs.capacity, hs.bins, host.task_ends.len());
    // (part, words, shape) in buffer order.
    let scratch_parts = [
        ("desc", DESC_WORDS, vec![DESC_WORDS]),
        ("task_ends", works, vec![works]),
        ("task_segments", cap, vec![cap]),
        ("bins", BIN_ROWS * bins, vec![BIN_ROWS, bins]),
        ("task_decode", cap * DEC_WORDS, vec![cap, DEC_WORDS]),
    ];
    let table_parts = [
        ("task_meta", cap * META_WORDS, vec![cap, META_WORDS]),
        ("task_qrows", cap * TASK_QUERIES, vec![cap, TASK_QUERIES]),
        ("task_qpos", cap * TASK_QUERIES, vec![cap, TASK_QUERIES]),
    ];
    for (buf, hbuf, parts) in [
        (&scratch, &hscratch, &scratch_parts[..]),
        (&tables, &htables, &table_parts[..]),
    ] {
        let mut at = 0;
        for (part, words, shape) in parts {
            r.push(exact(
                &name(part),
                &buf[at..at + words],
                &hbuf[at..at + words],
                shape,
            ));
            at += words;
        }
    }
    r
}

/// Device prepare + task build of every selection of `group` against the host.
fn check_group(sweep: &mut Sweep, msa: &CudaMsa, group: &SelectionGroup) {
    let sms = msa.device().sm_count as usize;
    let l = &group.layout;
    let dl = device_layout(msa, l);
    let mut report = CheckReport::default();
    let mut descs = Vec::new();
    for (selection, topk) in &group.selections {
        let meta = device_metadata(msa, &dl, topk);
        let host = host_metadata(l, topk, sms);
        // The task build reads prepare's tables: one summary line while they agree, every line
        // when they do not (then table mismatches follow from them).
        let m = compare_metadata(msa, &meta, &host, &format!("{selection}/prepare"));
        if m.passed() {
            report.push(msa_harness::check::CheckLine {
                tensor: format!("{selection}/prepare"),
                metric: "failed_lines",
                value: 0.0,
                limit: 0.0,
                passed: true,
                detail: format!("{} metadata tensors equal the host's", m.lines.len()),
            });
        } else {
            report.extend(m);
        }
        let schedule =
            MsaBackwardSchedule::from_plan(l, &host.csr, &host.items, host.table.capacity)
                .expect("host schedule");
        let host_tables = build_backward_tasks(&schedule, l.total_q(), l.workspace_rows(), sms)
            .expect("host task build");
        let dev = msa
            .task_build(&meta)
            .unwrap_or_else(|e| panic!("{} {selection}: task_build: {e}", group.name));
        report.extend(compare_tables(msa, &dev, &host_tables, selection));
        descs.push(json!({ selection.as_str(): host_tables.desc }));
    }
    sweep.record(
        &group.name,
        &report,
        json!({ "total_q": l.total_q(), "workspace_rows": l.workspace_rows(), "sms": sms, "desc": descs }),
    );
}

#[test]
fn task_build_matches_the_host_mirror_on_dev_cases() {
    let msa = harness::device();
    let mut sweep = Sweep::new("task_build_dev_cases");
    // One rank per case, a different one for each case.
    for group in harness::dev_selection_groups(|i| vec![(5 * i + 3) % 16]) {
        check_group(&mut sweep, msa, &group);
    }
    sweep.finish();
}

#[test]
fn task_build_matches_the_host_mirror_on_edge_layouts() {
    let msa = harness::device();
    let mut sweep = Sweep::new("task_build_edge_layouts");
    for group in harness::edge_selection_groups() {
        check_group(&mut sweep, msa, &group);
    }
    sweep.finish();
}

/// msa-plan's hand-computed plan: documents of 10 and 130 tokens in a 512-row workspace; head 0
/// selects every query's block 0 and block 1 for positions 128/129, head 3 block 1 for 129.
fn small_plan() -> (VarlenLayout, msa_plan::K2qCsr, Vec<WorkItem>) {
    let l = VarlenLayout::documents(&[0, 10, 140]).unwrap();
    let mut topk = vec![-1; 4 * 140 * 16];
    for q in 0..140 {
        topk[q * 16 + 3] = 0;
    }
    topk[138 * 16 + 9] = 1;
    topk[139 * 16] = 1;
    topk[(3 * 140 + 139) * 16 + 15] = 1;
    let csr = build_k2q_csr(&l, &topk).unwrap();
    let items = build_work_items(&l, &csr, 64).unwrap();
    (l, csr, items)
}

/// Upload `schedule`, build it on the device and on the host, and compare; `flags` is the
/// descriptor flag word the case is meant to produce (checked on the host result too, so the
/// case provably exercises it).
fn check_schedule(
    msa: &CudaMsa,
    case: &str,
    schedule: &MsaBackwardSchedule,
    tokens: usize,
    workspace_rows: usize,
    sms: usize,
    flags: i32,
) -> CheckReport {
    let host = build_backward_tasks(schedule, tokens, workspace_rows, sms).expect("host build");
    let uploaded = DeviceSchedule::upload(msa, schedule).expect("upload schedule");
    let dev = msa
        .task_build_schedule(&uploaded, tokens, workspace_rows, sms)
        .unwrap_or_else(|e| panic!("{case}: task_build_schedule: {e}"));
    let mut r = compare_tables(msa, &dev, &host, case);
    r.push(exact(
        &format!("{case}/host_flags"),
        &[host.desc[DESC_FLAGS]],
        &[flags],
        &[1],
    ));
    r
}

#[test]
fn task_build_hand_made_schedules() {
    let msa = harness::device();
    let (l, csr, items) = small_plan();
    let cap = flat_schedule_capacity(3, 140, 64);
    let plan = |items: &[WorkItem], cap: usize| {
        MsaBackwardSchedule::from_plan(&l, &csr, items, cap).expect("schedule")
    };
    let ws = l.workspace_rows();
    let mut reversed = items.clone();
    reversed.reverse();
    let parts = |count: i32| {
        let s = plan(&items, 6);
        MsaBackwardSchedule::new(ScheduleParts {
            row_ptr: Int32Array::new(s.row_ptr().to_vec(), &[4, s.rows() + 1]),
            q_indices: Int32Array::new(s.q_indices().to_vec(), &[4, s.edge_capacity()]),
            scheduler_metadata: Int32Array::new(s.scheduler_metadata().to_vec(), &[6, 6]),
            work_count: Int32Array::vector(vec![count]),
            cu_seqlens: Int32Array::vector(s.cu_seqlens().to_vec()),
            document_workspace_starts: Int32Array::vector(s.document_workspace_starts().to_vec()),
            query_offsets: None,
        })
        .expect("schedule parts")
    };
    let cases: Vec<(&str, MsaBackwardSchedule, i32)> = vec![
        ("forward_order", plan(&items, cap), 0),
        ("reversed", plan(&reversed, cap), 0),
        (
            "noncontiguous",
            plan(&[items[1], items[4], items[2]], cap),
            FLAG_NONCONTIGUOUS_SEGMENTS,
        ),
        // 200 copies of an 8-task item: 1600 tasks past a capacity of 4·2240/8 + 200 = 1320.
        (
            "overflow",
            plan(&vec![items[1]; 200], 200),
            FLAG_CAPACITY_OVERFLOW,
        ),
        (
            "overflow_noncontiguous",
            plan(
                &[vec![items[1]; 150], vec![items[4]], vec![items[1]; 49]].concat(),
                200,
            ),
            FLAG_CAPACITY_OVERFLOW | FLAG_NONCONTIGUOUS_SEGMENTS,
        ),
        ("work_count_high", parts(99), 0),
        ("work_count_negative", parts(-5), 0),
        ("empty", plan(&[], 1), 0),
    ];
    let mut sweep = Sweep::new("task_build_hand_made");
    for (case, schedule, flags) in &cases {
        let mut report = CheckReport::default();
        for sms in [1, 2, 132] {
            report.extend(check_schedule(
                msa,
                &format!("sms{sms}"),
                schedule,
                140,
                ws,
                sms,
                *flags,
            ));
        }
        sweep.record(case, &report, json!({ "flags": flags }));
    }
    sweep.finish();
}

#[test]
fn task_build_walk_regimes_of_a_dev_case() {
    let msa = harness::device();
    let group = harness::dev_selection_groups(|i| if i == 0 { vec![0] } else { vec![] })
        .next()
        .expect("a dev case");
    let (selection, topk) = &group.selections[0];
    let l = &group.layout;
    let host = host_metadata(l, topk, msa.device().sm_count as usize);
    let schedule = MsaBackwardSchedule::from_plan(l, &host.csr, &host.items, host.table.capacity)
        .expect("host schedule");
    let mut report = CheckReport::default();
    // Tens of thousands of task rows: the 64-row walk with and without tails, and the short-tail
    // fallback to plain chunks.
    for sms in [1, 7, 132, 148, 4096] {
        report.extend(check_schedule(
            msa,
            &format!("{selection}/sms{sms}"),
            &schedule,
            l.total_q(),
            l.workspace_rows(),
            sms,
            0,
        ));
    }
    harness::record("task_build_walks", &group.name, &report, json!({}));
}

#[test]
fn task_build_rejects_bad_sizes_before_any_launch() {
    let msa = harness::device();
    let (l, csr, items) = small_plan();
    let s = MsaBackwardSchedule::from_plan(&l, &csr, &items, 6).unwrap();
    let uploaded = DeviceSchedule::upload(msa, &s).unwrap();
    let mut report = CheckReport::default();
    for (case, tokens, ws, sms) in [
        ("too_many_bins", 140, (1usize << 27) + BLOCK_SIZE, 2),
        ("ragged_workspace", 140, 500, 2),
        ("no_sms", 140, 512, 0),
        ("query_past_tokens", 139, 512, 2),
    ] {
        let host = build_backward_tasks(&s, tokens, ws, sms).err();
        let dev = msa.task_build_schedule(&uploaded, tokens, ws, sms).err();
        let same = match (&dev, &host) {
            (Some(MsaError::Plan(d)), Some(h)) => d == h,
            _ => false,
        };
        report.push(msa_harness::check::CheckLine {
            tensor: case.to_string(),
            metric: "equal",
            value: if same { 0.0 } else { 1.0 },
            limit: 0.0,
            passed: same,
            detail: if same {
                String::new()
            } else {
                format!("device {dev:?}, host {host:?}")
            },
        });
    }
    harness::record("task_build_errors", "small_plan", &report, json!({}));
}
