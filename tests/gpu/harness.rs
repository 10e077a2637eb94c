//! Shared machinery of the GPU suite: the device, result records, and case builders.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use msa::cuda::CudaMsa;
use msa_harness::check::CheckReport;

/// The KL's loss coefficient in every suite run: not 1, so a kernel that drops it (or applies it
/// twice) fails.
pub const LOSS_COEFF: f32 = 1.7;

/// One device for the whole suite, with output poisoning on: every output buffer the facade
/// allocates is filled with NaN/sentinel words first, so an unwritten element fails its check.
pub fn device() -> &'static CudaMsa {
    static DEVICE: OnceLock<CudaMsa> = OnceLock::new();
    DEVICE.get_or_init(|| {
        CudaMsa::new(0)
            .unwrap_or_else(|e| panic!("the GPU suite needs a device: {e}"))
            .with_poisoned_outputs(true)
    })
}

/// Print a check report and append it to `$MSA_GPU_RESULTS/gpu-results.jsonl`; panics (fails
/// the test) when any line failed.
pub fn record(test: &str, case: &str, report: &CheckReport, extra: serde_json::Value) {
    record_soft(test, case, report, extra);
    assert!(
        report.passed(),
        "[{test}] {case}: check failed\n{}",
        report.table()
    );
}

/// Like [`record`] but never panics: sweeps record every case, then assert once. A report with
/// no line checked nothing: it is refused (a skip is [`record_skip`]ped, never passed).
pub fn record_soft(test: &str, case: &str, report: &CheckReport, extra: serde_json::Value) {
    assert!(
        !report.lines.is_empty(),
        "[{test}] {case}: an empty report checks nothing; record a skip instead"
    );
    println!("[{test}] {case}\n{}", report.table());
    let status = if report.passed() { "passed" } else { "failed" };
    append(serde_json::json!({
        "test": test,
        "case": case,
        "status": status,
        "passed": report.passed(),
        "lines": report.lines,
        "extra": extra,
    }));
}

/// Record that `case` of `test` was NOT checked, and why: printed loudly and written as
/// `"status": "skipped"` (with `"passed": null`), so no summary counts it as a pass.
pub fn record_skip(test: &str, case: &str, reason: &str) {
    println!("[{test}] {case}: SKIPPED ({reason})");
    append(serde_json::json!({
        "test": test,
        "case": case,
        "status": "skipped",
        "passed": null,
        "reason": reason,
    }));
}

/// Append one JSON line to `$MSA_GPU_RESULTS/gpu-results.jsonl`, when set.
fn append(line: serde_json::Value) {
    if let Ok(dir) = std::env::var("MSA_GPU_RESULTS") {
        static FILE: Mutex<()> = Mutex::new(());
        let _guard = FILE.lock().unwrap();
        let path = std::path::Path::new(&dir).join("gpu-results.jsonl");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("results file");
        writeln!(f, "{line}").expect("write results");
    }
}

// ---------------------------------------------------------------------------------------------
// Selection cases: layouts paired with top-k selections, for the metadata tests (prepare, task
// build).

use msa_plan::testing::{layout_from_documents, layouts, random_topk, recent_topk, LayoutConfig};
use msa_plan::VarlenLayout;
use msa_workloads::{case_seed, make_topk, parse_manifest, CpConfig, Pattern};

/// The dev manifest (`msa_workloads::DEV_MANIFEST`), compiled in so the suite binary runs from
/// any directory of any machine.
const DEV_MANIFEST_TEXT: &str = include_str!("../../data/cases/cp16_192k_dev.jsonl");

/// `Pattern::Indexer` runs the CPU indexer (about 1 kflop per causal element); above this many
/// causal elements a layout skips it to keep the suite's host time small.
pub const INDEXER_CAUSAL_BUDGET: u64 = 20_000_000;

/// One layout and the selections to test on it, each named (pattern or generator).
pub struct SelectionGroup {
    pub name: String,
    pub layout: VarlenLayout,
    pub selections: Vec<(String, Vec<i32>)>,
}

/// Every verification pattern's selection for `layout` (named `name`) under `seed`; the indexer
/// only within [`INDEXER_CAUSAL_BUDGET`], and a layout above it says so (a recorded skip).
fn pattern_selections(name: &str, layout: &VarlenLayout, seed: u64) -> Vec<(String, Vec<i32>)> {
    let causal = msa_plan::causal_elements(layout);
    let cheap = causal <= INDEXER_CAUSAL_BUDGET;
    if !cheap {
        record_skip(
            "selections",
            &format!("{name}/indexer"),
            &format!(
                "the indexer pattern is dropped: {causal} causal elements, above the CPU \
                 indexer's budget of {INDEXER_CAUSAL_BUDGET}"
            ),
        );
    }
    Pattern::verification_set()
        .into_iter()
        .filter(|&p| p != Pattern::Indexer || cheap)
        .map(|p| (p.to_string(), make_topk(layout, p, seed)))
        .collect()
}

/// Every dev case at the CP16 ranks `ranks(case index)`, under every verification pattern with
/// the CLI's seed (`case_seed(case, rank, 0)`). Built lazily, one (case, rank) at a time.
pub fn dev_selection_groups(
    ranks: impl Fn(usize) -> Vec<usize>,
) -> impl Iterator<Item = SelectionGroup> {
    let cases = parse_manifest(DEV_MANIFEST_TEXT).expect("the embedded dev manifest parses");
    cases.into_iter().enumerate().flat_map(move |(i, case)| {
        let split = case
            .rank_cases(&CpConfig::default())
            .expect("dev cases split over CP16");
        let wanted = ranks(i);
        split
            .into_iter()
            .filter(move |rc| wanted.contains(&rc.rank()))
            .map(|rc| {
                let layout = rc.layout().clone();
                let seed = case_seed(rc.case_id(), rc.rank(), 0);
                let name = format!("case{}/r{}", rc.case_id(), rc.rank());
                SelectionGroup {
                    selections: pattern_selections(&name, &layout, seed),
                    name,
                    layout,
                }
            })
    })
}

/// Layouts where off-by-one rules break: T below one block, single-token documents, lengths
/// that are not multiples of 128, CP fragments (shared physical blocks, query offsets), a
/// fragment with keys but no queries, empty batch entries, several 512-query windows; then
/// random layouts of `msa_plan::testing` (deterministic); then a document whose fragments
/// straddle the level kernel's tile of 128 fragments.
pub fn edge_layouts() -> Vec<(String, VarlenLayout)> {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let doc = |cu: &[i32]| VarlenLayout::documents(cu).expect("valid edge layout");
    let mut out = vec![
        ("one_token".to_string(), doc(&[0, 1])),
        ("below_one_block".to_string(), doc(&[0, 100])),
        ("single_tokens".to_string(), doc(&[0, 1, 2, 3, 4, 5])),
        ("odd_lengths".to_string(), doc(&[0, 300, 429, 430, 1000])),
        ("whole_blocks".to_string(), doc(&[0, 128, 384])),
        ("several_windows".to_string(), doc(&[0, 3000, 3001, 5000])),
        (
            "cp_shared_block".to_string(),
            VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap(),
        ),
        (
            "keys_without_queries".to_string(),
            VarlenLayout::new(&[0, 0, 5], &[0, 100, 105], Some(&[0, 0])).unwrap(),
        ),
        (
            "cp_fragments".to_string(),
            layout_from_documents(
                &[
                    vec![(10, 50), (200, 260), (700, 1300)],
                    vec![],
                    vec![(0, 5)],
                    vec![(0, 129), (1000, 2049)],
                ],
                false,
            ),
        ),
    ];
    let config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = layouts(LayoutConfig {
        max_documents: 8,
        max_doc_len: 3000,
        max_fragments: 4,
        empty_documents: true,
    });
    for i in 0..24 {
        let layout = strategy
            .new_tree(&mut runner)
            .expect("layout strategy")
            .current();
        out.push((format!("random{i}"), layout));
    }
    // Last, so the earlier layouts keep their indices (their selection seeds).
    out.push((
        // A document's fragments 126..129 straddle prepare's level tile of 128 fragments:
        // the physical rows of fragments 128 and 129 count the earlier ones' edges from the
        // bitmap, not from the tile in shared memory.
        "fragments_across_tiles".to_string(),
        layout_from_documents(
            &std::iter::repeat_n(vec![(0, 3)], 126)
                .chain([vec![(0, 40), (150, 200), (300, 420), (600, 700)]])
                .chain(std::iter::repeat_n(vec![(0, 200)], 10))
                .collect::<Vec<_>>(),
            false,
        ),
    ));
    out
}

/// [`edge_layouts`] with `msa_plan::testing`'s selections (the recent pattern, and random ones
/// with `-1` holes in random slots) and every verification pattern.
pub fn edge_selection_groups() -> impl Iterator<Item = SelectionGroup> {
    edge_layouts()
        .into_iter()
        .enumerate()
        .map(|(i, (name, layout))| {
            let seed = 0x5EED_0000 + i as u64;
            let mut selections = vec![
                ("recent".to_string(), recent_topk(&layout)),
                ("random_holes".to_string(), random_topk(&layout, seed)),
            ];
            selections.extend(pattern_selections(&name, &layout, seed));
            SelectionGroup {
                name,
                layout,
                selections,
            }
        })
}

/// A fresh handle on device 0 (same primary context) for APIs that own their `CudaMsa`.
pub fn open_device() -> CudaMsa {
    CudaMsa::new(0)
        .expect("device 0")
        .with_poisoned_outputs(true)
}

/// The attention kernel sets this device runs, each on a fresh handle: `sm90` (the default on
/// Hopper) and `sm80` (the mma.sync kernels, forced), or `sm80` alone elsewhere.
/// `MSA_KERNEL_SETS=sm90` (or `sm80`) keeps one of them on Hopper.
pub fn kernel_sets() -> Vec<(&'static str, CudaMsa)> {
    let default = open_device();
    if !default.uses_sm90_kernels() {
        return vec![("sm80", default)];
    }
    let wanted = std::env::var("MSA_KERNEL_SETS").unwrap_or_else(|_| "sm90,sm80".into());
    let mut sets = Vec::new();
    if wanted.split(',').any(|k| k == "sm90") {
        sets.push(("sm90", default));
    }
    if wanted.split(',').any(|k| k == "sm80") {
        sets.push(("sm80", open_device().with_sm80_kernels(true)));
    }
    assert!(
        !sets.is_empty(),
        "MSA_KERNEL_SETS={wanted}: expected sm90 and/or sm80"
    );
    sets
}

/// The GPU indexer's selection for a case's qi/ki (MSA's own flow: indexer → attention).
pub fn gpu_indexer_selection(p: &msa_harness::io::CallInputs) -> Vec<i32> {
    let d = device();
    let index = p.index.as_ref().expect("indexer inputs");
    let layout = msa::cuda::DeviceLayout::new(d, p.layout.clone()).expect("layout");
    let qi = d.upload(&index.qi).expect("qi");
    let ki = d.upload(&index.ki).expect("ki");
    let (topk, _lse) = d
        .indexer_forward(&layout, &qi, &ki)
        .expect("indexer forward");
    d.download(&topk).expect("download topk")
}

/// The range `a..b` an environment variable names (to split a long test across processes), cut
/// to `0..len`; all of `0..len` when it is unset.
pub fn env_range(var: &str, len: usize) -> std::ops::Range<usize> {
    let Ok(spec) = std::env::var(var) else {
        return 0..len;
    };
    let (a, b) = spec
        .split_once("..")
        .unwrap_or_else(|| panic!("{var}=a..b, got {spec:?}"));
    let parse = |x: &str| -> usize {
        x.parse()
            .unwrap_or_else(|_| panic!("{var}=a..b, got {spec:?}"))
    };
    parse(a).min(len)..parse(b).min(len)
}
