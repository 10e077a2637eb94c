//! The `msa` command end to end: exit codes, messages, files written and refused.
//!
//! `info` and `run --backend cuda` describe a build without the `msa` feature; every other
//! command here runs on the CPU backend and holds with either build.

// The independent safetensors encoder of msa-harness's I/O tests.
#[path = "../../msa-harness/tests/fixture/mod.rs"]
mod fixture;

use fixture::{encode, i32_bytes};

/// (name, dtype, shape, little-endian bytes) of one tensor.
type Raw = (&'static str, &'static str, Vec<usize>, Vec<u8>);
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use half::bf16;
use msa_harness::backend::{Backend, RunOptions};
use msa_harness::io::{read_inputs, read_outputs, write_outputs, Outputs};
use msa_plan::topology::{
    HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};

mod common;
use common::{expect_exit, manifest_line, msa, stderr, stdout, tmp};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A clap usage error: `value` rejected for `flag` (the message names the flag's value name).
fn assert_invalid_value(o: &Output, value: &str, flag: &str) {
    let err = stderr(o);
    assert!(
        err.starts_with(&format!("error: invalid value '{value}' for '{flag} <")),
        "{err}"
    );
}

/// Whether a check table has a line for `tensor`.
fn has_check(text: &str, tensor: &str) -> bool {
    text.lines()
        .any(|l| l.split_whitespace().next() == Some(tensor))
}

/// A report whose one failed check is `out`, worst at element `index` (its first line is the
/// verdict).
fn assert_only_out_fails_at(text: &str, index: usize) {
    let failed: Vec<&str> = text
        .lines()
        .skip(1)
        .filter(|l| l.contains(" FAIL"))
        .collect();
    assert_eq!(failed.len(), 1, "{text}");
    assert!(
        failed[0].trim_start().starts_with("out ")
            && failed[0].contains(&format!("worst at {index}")),
        "{text}"
    );
}

// ---- info, plan, run --------------------------------------------------------------------------

#[cfg(not(feature = "msa"))]
#[test]
fn info_says_the_feature_is_off_and_why_there_is_no_device() {
    let o = msa(&["info"]);
    expect_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("feature msa: off"), "{out}");
    assert!(
        out.contains("kernel architectures: none (built without `msa`)"),
        "{out}"
    );
    assert!(
        out.contains("devices: unavailable: msa-rs was built without CUDA support; rebuild with `--features msa`"),
        "{out}"
    );
}

#[test]
fn plan_of_a_real_rank_has_12288_queries() {
    let o = msa(&[
        "plan",
        "--case",
        "434",
        "--rank",
        "0",
        "--pattern",
        "recent16",
    ]);
    expect_exit(&o, 0);
    let out = stdout(&o);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[..3], ["case", "T", "Tk"], "{out}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0].len(), header.len(), "{out}");
    assert_eq!(rows[0][..2], ["case434/r0/recent16/s0", "12288"], "{out}");
    // The sm_90a kernels' run order balances this short-document rank's CTAs better than striding
    // in natural order (backward 1.64 -> 1.13 when written).
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("most-loaded CTA"))
        .expect(&err);
    let ratios: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    let [fwd_natural, fwd_run, bwd_natural, bwd_run] = ratios[ratios.len() - 4..] else {
        panic!("{line}")
    };
    assert!(fwd_run <= fwd_natural && bwd_run < bwd_natural, "{line}");
    assert!(bwd_natural > 1.3 && bwd_run < 1.2, "{line}");
}

#[test]
fn a_pattern_list_runs_each_case_under_each_pattern_case_by_case() {
    let o = msa(&[
        "plan",
        "--case",
        "434,61",
        "--rank",
        "0",
        "--pattern",
        "recent16,random",
    ]);
    expect_exit(&o, 0);
    let out = stdout(&o);
    let names: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "case434/r0/recent16/s0",
            "case434/r0/random/s0",
            "case61/r0/recent16/s0",
            "case61/r0/random/s0"
        ],
        "{out}"
    );
    let o = msa(&["plan", "--pattern", "recent16,recent8"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "recent8", "--pattern");
}

#[cfg(not(feature = "msa"))]
#[test]
fn run_on_cuda_fails_with_the_probe_message() {
    let o = msa(&["run", "--backend", "cuda", "--case", "434", "--rank", "0"]);
    expect_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("error: msa-rs was built without CUDA support"),
        "{err}"
    );
    assert!(!stdout(&o).contains("PASS"));
}

#[test]
fn bench_names_a_bad_stage_and_needs_the_gpu() {
    let o = msa(&["bench", "--stages", "forward,fwd"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "fwd", "--stages");
    assert!(
        stderr(&o).contains(
            "[possible values: prepare, prepare_checked, tables, forward, backward, backward_det, indexer, \
             selection_lse, kl, forward_sm80, backward_sm80, backward_det_sm80]"
        ),
        "{}",
        stderr(&o)
    );
    let o = msa(&["bench", "--stages", "upload"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "upload", "--stages");
    let o = msa(&["bench", "--iters", "0"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "0", "--iters");
    #[cfg(not(feature = "msa"))]
    {
        let o = msa(&["bench", "--case", "434", "--rank", "0"]);
        expect_exit(&o, 2);
        assert!(
            stderr(&o).contains("error: msa-rs was built without CUDA support"),
            "{}",
            stderr(&o)
        );
    }
}

/// One pack of 16·1,024 tokens: documents of a few hundred tokens (none a multiple of 128), so
/// each CP16 rank holds one 1,024-query chunk that cuts documents into fragments.
fn small_pack() -> Vec<i32> {
    const TOTAL: i32 = 16 * 1024;
    let mut cu = vec![0];
    for len in [421, 650, 333, 517, 250, 700, 389].into_iter().cycle() {
        let end = cu.last().unwrap() + len;
        if end >= TOTAL - 100 {
            break;
        }
        cu.push(end);
    }
    cu.push(TOTAL);
    cu
}

#[test]
fn run_on_cpu_passes_on_a_small_custom_manifest() {
    let manifest = tmp("small.jsonl");
    // A second case proves the id picks the line.
    let text = format!(
        "{}\n{}\n",
        manifest_line(7, &small_pack()),
        manifest_line(8, &[0, 16 * 1024])
    );
    std::fs::write(&manifest, text).unwrap();
    // The rank is what the test means it to be: 1,024 queries, some in fragments that continue a
    // document started on another rank (K longer than the queries).
    let cases = msa_harness::cases::manifest(&manifest).unwrap();
    let rank = msa_harness::cases::rank_case(&cases, 7, 3).unwrap();
    assert_eq!(rank.layout().total_q(), 1024);
    assert!(rank.layout().fragments().iter().any(|f| f.k_len > f.q_len));
    assert!(rank.layout().batch() > 1);
    let json = tmp("small-run.jsonl");
    let args = [
        "run",
        "--manifest",
        s(&manifest),
        "--case",
        "7",
        "--rank",
        "3",
        "--backend",
        "cpu",
    ];
    let o = msa(&[&args[..], &["--indexer", "--kl", "--json", s(&json)]].concat());
    expect_exit(&o, 0);
    let out = stdout(&o);
    assert!(
        out.starts_with("case7/r3/recent16/s0 on cpu: PASS\n"),
        "{out}"
    );
    for stage in [
        "upload",
        "prepare",
        "forward",
        "backward",
        "indexer",
        "selection_lse",
        "kl",
    ] {
        assert!(out.contains(&format!("time {stage} ")), "{out}");
    }
    for tensor in [
        "out",
        "lse",
        "dq",
        "dk",
        "dv",
        "indexer_topk",
        "indexer_lse",
        "kl_indexer_lse",
        "dqi",
    ] {
        assert!(has_check(&out, tensor), "no {tensor} check in\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");

    let record: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&json).unwrap().trim()).unwrap();
    assert_eq!(record["case"], "case7/r3/recent16/s0");
    assert_eq!(record["backend"], "cpu");
    assert_eq!(record["passed"], true);
    let lines = record["lines"].as_array().unwrap();
    assert!(
        lines.len() >= 10 && lines.iter().all(|l| l["passed"] == true),
        "{record}"
    );
    let stages: Vec<&str> = record["times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "upload",
            "prepare",
            "forward",
            "tables",
            "backward",
            "indexer",
            "selection_lse",
            "kl"
        ]
    );
}

#[test]
fn help_lists_the_values_of_every_typed_flag() {
    let o = msa(&["run", "-h"]);
    expect_exit(&o, 0);
    let help = stdout(&o);
    for values in [
        "[possible values: auto, cpu, cuda]",
        "[possible values: auto, full, sample, none]",
        "[possible values: msa, strict]",
        "[possible values: recent16, indexer, b0p99, random, spread, pool-16,",
    ] {
        assert!(help.contains(values), "no `{values}` in\n{help}");
    }
    let o = msa(&["bench", "-h"]);
    expect_exit(&o, 0);
    assert!(
        stdout(&o).contains("forward_sm80, backward_sm80, backward_det_sm80]"),
        "{}",
        stdout(&o)
    );
}

// ---- argument errors --------------------------------------------------------------------------

#[test]
fn bad_case_arguments_are_rejected_with_the_reason() {
    let o = msa(&["plan", "--pattern", "recent8"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "recent8", "--pattern");
    assert!(
        stderr(&o).contains(
            "[possible values: recent16, indexer, b0p99, random, spread, pool-16, pool-32, \
             pool-64, pool-128, pool-256, hot15_tail1, hot8_tail8]"
        ),
        "{}",
        stderr(&o)
    );
    // pool-N patterns parse like the others.
    expect_exit(&msa(&["plan", "--pattern", "pool-64"]), 0);

    let o = msa(&["plan", "--case", "999999"]);
    expect_exit(&o, 2);
    let err = stderr(&o);
    assert!(err.starts_with("error: case 999999: not in "), "{err}");
    assert!(err.trim_end().ends_with("cp16_192k_dev.jsonl"), "{err}");

    let o = msa(&["run", "--case", "434", "--rank", "16", "--backend", "cpu"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "16", "--rank");
    assert!(
        stderr(&o).contains("rank 16 is out of range (CP size 16)"),
        "{}",
        stderr(&o)
    );
    let o = msa(&["plan", "--cases", "434:3,605"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "605", "--cases");
    assert!(stderr(&o).contains("expected case:rank"), "{}", stderr(&o));

    let o = msa(&["run", "--backend", "gpu"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "gpu", "--backend");
    assert!(
        stderr(&o).contains("[possible values: auto, cpu, cuda]"),
        "{}",
        stderr(&o)
    );
}

// ---- attention and compare --------------------------------------------------------------------

/// `n` bf16 values in [-0.5, 0.5) from a 64-bit LCG, as little-endian bytes.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (state >> 40) as f32 / (1u64 << 24) as f32;
            bf16::from_f32(u - 0.5).to_bits().to_le_bytes()
        })
        .collect()
}

// One document of 200 keys in two fragments: queries at positions 127..130 (K 0..130) and
// 195..200 (K 0..200), so the first fragment straddles the block edge. T = 8, Tk = 200.
const T: usize = 8;
const TK: usize = 200;

/// `[4, T, 16]`: a different valid selection per group (all visible blocks, the local block
/// alone, both in reverse order, block 0 alone), padded with -1.
fn topk() -> Vec<i32> {
    let positions = [127, 128, 129, 195, 196, 197, 198, 199];
    let mut topk = vec![-1; NUM_KV_HEADS * T * TOPK_BLOCKS];
    for g in 0..NUM_KV_HEADS {
        for (q, p) in positions.iter().enumerate() {
            let local = p / 128;
            let entries: Vec<i32> = match g {
                0 => (0..=local).collect(),
                1 => vec![local],
                2 => (0..=local).rev().collect(),
                _ => vec![0],
            };
            topk[(g * T + q) * TOPK_BLOCKS..][..entries.len()].copy_from_slice(&entries);
        }
    }
    topk
}

/// Every input tensor, seeded.
fn inputs(seed: u64) -> Vec<Raw> {
    vec![
        (
            "q",
            "BF16",
            vec![T, NUM_Q_HEADS, HEAD_DIM],
            noise(T * NUM_Q_HEADS * HEAD_DIM, seed),
        ),
        (
            "k",
            "BF16",
            vec![TK, NUM_KV_HEADS, HEAD_DIM],
            noise(TK * NUM_KV_HEADS * HEAD_DIM, seed + 1),
        ),
        (
            "v",
            "BF16",
            vec![TK, NUM_KV_HEADS, HEAD_DIM],
            noise(TK * NUM_KV_HEADS * HEAD_DIM, seed + 2),
        ),
        (
            "topk_indices",
            "I32",
            vec![NUM_KV_HEADS, T, TOPK_BLOCKS],
            i32_bytes(&topk()),
        ),
        ("cu_seqlens_q", "I32", vec![3], i32_bytes(&[0, 3, 8])),
        ("cu_seqlens_k", "I32", vec![3], i32_bytes(&[0, 130, 200])),
        ("fragment_indices", "I32", vec![2], i32_bytes(&[0, 0])),
        (
            "dout",
            "BF16",
            vec![T, NUM_Q_HEADS, HEAD_DIM],
            noise(T * NUM_Q_HEADS * HEAD_DIM, seed + 3),
        ),
        (
            "qi",
            "BF16",
            vec![T, NUM_INDEX_HEADS, INDEX_DIM],
            noise(T * NUM_INDEX_HEADS * INDEX_DIM, seed + 4),
        ),
        (
            "ki",
            "BF16",
            vec![TK, 1, INDEX_DIM],
            noise(TK * INDEX_DIM, seed + 5),
        ),
    ]
}

fn write_file(name: &str, tensors: &[Raw]) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, encode(tensors)).unwrap();
    p
}

fn attention(inputs: &Path, outputs: &Path, force: bool) -> Output {
    let mut args = vec![
        "attention",
        "--inputs",
        s(inputs),
        "--outputs",
        s(outputs),
        "--backend",
        "cpu",
    ];
    if force {
        args.push("--force");
    }
    msa(&args)
}

/// What the library's CPU backend computes for an inputs file, as `msa attention` runs it.
fn library_outputs(inputs: &Path) -> Outputs {
    let p = read_inputs(inputs).unwrap();
    let opts = RunOptions {
        backward: true,
        indexer: true,
        kl: false,
        deterministic: false,
        loss_coeff: 1.0,
    };
    Backend::Cpu.run(&p, &opts).unwrap().outputs
}

#[test]
fn attention_writes_every_output_and_overwrites_only_with_force() {
    let (in_a, in_b) = (
        write_file("attn-a.safetensors", &inputs(1)),
        write_file("attn-b.safetensors", &inputs(11)),
    );
    let out = tmp("attn-out.safetensors");
    let o = attention(&in_a, &out, false);
    expect_exit(&o, 0);
    assert!(
        stderr(&o).contains("T 8, Tk 200, 2 fragments; backward true, indexer true; backend cpu"),
        "{}",
        stderr(&o)
    );

    let got = read_outputs(&out).unwrap();
    let finite = |x: &[bf16]| x.iter().all(|v| v.to_f32().is_finite());
    for (name, x, len) in [
        ("out", got.out.as_deref(), T * NUM_Q_HEADS * HEAD_DIM),
        ("dq", got.dq.as_deref(), T * NUM_Q_HEADS * HEAD_DIM),
        ("dk", got.dk.as_deref(), TK * NUM_KV_HEADS * HEAD_DIM),
        ("dv", got.dv.as_deref(), TK * NUM_KV_HEADS * HEAD_DIM),
    ] {
        let x = x.unwrap_or_else(|| panic!("{name} is missing"));
        assert_eq!(x.len(), len, "{name}");
        assert!(finite(x), "{name} has non-finite values");
        assert!(x.iter().any(|v| v.to_f32() != 0.0), "{name} is all zero");
    }
    let lse = got.lse.as_deref().unwrap();
    assert_eq!(lse.len(), T * NUM_Q_HEADS);
    assert!(lse.iter().all(|v| v.is_finite()));
    let itopk = got.indexer_topk.as_deref().unwrap();
    assert_eq!(itopk.len(), NUM_INDEX_HEADS * T * TOPK_BLOCKS);
    // Position 127 sees block 0 only; 128 and later see blocks 0 and 1, the local one last.
    assert_eq!(itopk[..3], [0, -1, -1]);
    assert_eq!(itopk[TOPK_BLOCKS..TOPK_BLOCKS + 3], [0, 1, -1]);
    let ilse = got.indexer_lse.as_deref().unwrap();
    assert_eq!(ilse.len(), NUM_INDEX_HEADS * T);
    assert!(ilse.iter().all(|v| v.is_finite()));
    assert!(
        got.dqi.is_none() && got.dki.is_none(),
        "`msa attention` runs no KL backward"
    );
    assert_eq!(
        got,
        library_outputs(&in_a),
        "the command writes what the library computes"
    );

    // Without --force an existing file is refused before any work and left as it was.
    let before = std::fs::read(&out).unwrap();
    let o = attention(&in_b, &out, false);
    expect_exit(&o, 2);
    assert!(
        stderr(&o).contains("cli-attn-out.safetensors already exists (overwrite it with force)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&out).unwrap(), before);

    let o = attention(&in_b, &out, true);
    expect_exit(&o, 0);
    let got_b = read_outputs(&out).unwrap();
    assert_ne!(got_b, got);
    assert_eq!(got_b, library_outputs(&in_b));
}

#[test]
fn attention_names_a_missing_tensor() {
    let tensors: Vec<Raw> = inputs(2).into_iter().filter(|t| t.0 != "v").collect();
    let path = write_file("attn-no-v.safetensors", &tensors);
    let out = tmp("attn-no-v-out.safetensors");
    let o = attention(&path, &out, false);
    expect_exit(&o, 2);
    assert_eq!(stderr(&o).trim_end(), "error: tensor `v` is missing");
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn compare_passes_identical_outputs_and_fails_a_perturbed_one() {
    let input = write_file("cmp-in.safetensors", &inputs(3));
    let out = tmp("cmp-out.safetensors");
    expect_exit(&attention(&input, &out, false), 0);

    let o = msa(&["compare", s(&out), s(&out)]);
    expect_exit(&o, 0);
    let text = stdout(&o);
    assert!(text.lines().next().unwrap().ends_with(": PASS"), "{text}");
    for tensor in [
        "out",
        "lse",
        "dq",
        "dk",
        "dv",
        "indexer_topk",
        "indexer_lse",
    ] {
        assert!(has_check(&text, tensor), "no {tensor} line in\n{text}");
    }

    let mut bad = read_outputs(&out).unwrap();
    let x = &mut bad.out.as_mut().unwrap()[777];
    *x = bf16::from_f32(x.to_f32() + 1.0);
    let perturbed = tmp("cmp-perturbed.safetensors");
    write_outputs(&perturbed, &bad, false).unwrap();
    let o = msa(&["compare", s(&perturbed), s(&out)]);
    expect_exit(&o, 1);
    let text = stdout(&o);
    assert!(text.lines().next().unwrap().ends_with(": FAIL"), "{text}");
    assert_only_out_fails_at(&text, 777);

    // Outputs of a call with another T are an input error, not a comparison.
    let lse5: Vec<u8> = (0..5 * NUM_Q_HEADS)
        .flat_map(|_| 0f32.to_le_bytes())
        .collect();
    let other = write_file(
        "cmp-t5.safetensors",
        &[("lse", "F32", vec![5, NUM_Q_HEADS], lse5)],
    );
    let o = msa(&["compare", s(&other), s(&out)]);
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        "error: `lse` has 320 elements under test but 512 expected: the outputs are of different calls"
    );

    // A tensor the expected file has and the tested file lacks fails the comparison.
    let mut forward_only = read_outputs(&out).unwrap();
    forward_only.dq = None;
    let partial = tmp("cmp-forward-only.safetensors");
    write_outputs(&partial, &forward_only, false).unwrap();
    let o = msa(&["compare", s(&partial), s(&out)]);
    expect_exit(&o, 1);
    let text = stdout(&o);
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("dq")
            && l.contains("missing")
            && l.contains("FAIL")),
        "{text}"
    );
}

#[test]
fn compare_strict_tolerances_catch_what_msa_limits_allow() {
    let input = write_file("tol-in.safetensors", &inputs(5));
    let out = tmp("tol-out.safetensors");
    expect_exit(&attention(&input, &out, false), 0);
    // One element off by a third of MSA's limit (atol = rtol = 3e-2): inside it, but over the
    // strict one (3e-3) threefold.
    let mut off = read_outputs(&out).unwrap();
    let x = &mut off.out.as_mut().unwrap()[4242];
    *x = bf16::from_f32(x.to_f32() + 0.01 * (1.0 + x.to_f32().abs()));
    let shifted = tmp("tol-shifted.safetensors");
    write_outputs(&shifted, &off, false).unwrap();

    expect_exit(&msa(&["compare", s(&shifted), s(&out)]), 0);
    let o = msa(&["compare", "--tolerances", "strict", s(&shifted), s(&out)]);
    expect_exit(&o, 1);
    let text = stdout(&o);
    assert_only_out_fails_at(&text, 4242);

    let o = msa(&["compare", "--tolerances", "loose", s(&out), s(&out)]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "loose", "--tolerances");
    assert!(
        stderr(&o).contains("[possible values: msa, strict]"),
        "{}",
        stderr(&o)
    );
}

// ---- nothing lost: what `--outputs` and `--json` may write over --------------------------------

/// `msa` run by `sh` after `setup` (a umask, a ulimit); `args` are quoted for the shell.
fn msa_in_sh(setup: &str, args: &[&str]) -> Output {
    let quoted: Vec<String> = args
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{setup}; exec '{}' {}",
            env!("CARGO_BIN_EXE_msa"),
            quoted.join(" ")
        ))
        .output()
        .expect("sh runs")
}

/// A fresh scratch directory.
fn tmp_dir(name: &str) -> PathBuf {
    let d = tmp(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What `path` is, as `ls -l` would start its line (`c`, `p`, `l`, `d`, `-`).
fn file_kind(path: &Path) -> char {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::symlink_metadata(path).unwrap().file_type();
    match () {
        _ if t.is_char_device() => 'c',
        _ if t.is_fifo() => 'p',
        _ if t.is_symlink() => 'l',
        _ if t.is_dir() => 'd',
        _ => '-',
    }
}

/// The call ran (it prints the inputs' sizes first): refusals must come before it.
fn computed(o: &Output) -> bool {
    stderr(o).contains("T 8, Tk 200")
}

#[test]
fn attention_never_writes_over_a_device_a_fifo_a_link_or_a_directory() {
    let dir = tmp_dir("special");
    let input = write_file("special-in.safetensors", &inputs(21));
    let keep = dir.join("keep.safetensors");
    std::fs::write(&keep, b"keep").unwrap();
    let dev = dir.join("dev");
    let made = Command::new("mknod")
        .arg(&dev)
        .args(["c", "1", "3"])
        .status();
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let link = dir.join("link");
    std::os::unix::fs::symlink(&keep, &link).unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut targets = vec![
        (fifo, 'p', "a FIFO"),
        (link, 'l', "a symbolic link"),
        (sub, 'd', "a directory"),
    ];
    if made.is_ok_and(|s| s.success()) {
        targets.push((dev, 'c', "a character device"));
    } else {
        eprintln!("NOTE: mknod is not permitted here; the device-node case is skipped");
    }
    for (path, kind, what) in &targets {
        for force in [false, true] {
            let o = attention(&input, path, force);
            expect_exit(&o, 2);
            assert_eq!(
                stderr(&o).trim_end(),
                format!(
                    "error: {} is {what}, not a regular file; refusing to write over it",
                    path.display()
                ),
                "--force {force}"
            );
            assert!(!computed(&o));
            assert_eq!(file_kind(path), *kind, "{} was replaced", path.display());
        }
    }
    assert_eq!(std::fs::read(&keep).unwrap(), b"keep");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1 + targets.len());
}

#[test]
fn attention_never_writes_over_its_inputs() {
    let dir = tmp_dir("same");
    let input = dir.join("in.safetensors");
    std::fs::write(&input, encode(&inputs(22))).unwrap();
    let before = std::fs::read(&input).unwrap();
    let link = dir.join("link.safetensors");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let hard = dir.join("hard.safetensors");
    std::fs::hard_link(&input, &hard).unwrap();
    let respelt = dir.join(".").join("in.safetensors");
    for out in [&input, &link, &hard, &respelt] {
        let o = attention(&input, out, true);
        expect_exit(&o, 2);
        assert_eq!(
            stderr(&o).trim_end(),
            format!(
                "error: {} is the input file {}; write to another path",
                out.display(),
                input.display()
            )
        );
        assert!(!computed(&o));
    }
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

#[test]
fn outputs_get_the_usual_mode() {
    use std::os::unix::fs::PermissionsExt;
    let input = write_file("mode-in.safetensors", &inputs(23));
    for (umask, mode) in [("022", 0o644), ("077", 0o600), ("002", 0o664)] {
        let out = tmp(&format!("mode-{umask}.safetensors"));
        let args = [
            "attention",
            "--inputs",
            s(&input),
            "--outputs",
            s(&out),
            "--backend",
            "cpu",
        ];
        expect_exit(&msa_in_sh(&format!("umask {umask}"), &args), 0);
        let got = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, mode, "umask {umask}: mode {got:o}");
    }
}

#[test]
fn output_path_problems_are_found_before_any_work() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp_dir("paths");
    let input = write_file("paths-in.safetensors", &inputs(24));
    let missing = dir.join("no-such-dir").join("out.safetensors");
    let locked = dir.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let read_only = dir.join("read-only.safetensors");
    std::fs::write(&read_only, b"old").unwrap();
    std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o444)).unwrap();
    let cases = [
        (
            missing.clone(),
            format!(
                "cannot write {}: directory {} does not exist",
                missing.display(),
                missing.parent().unwrap().display()
            ),
        ),
        (
            locked.join("out.safetensors"),
            format!(
                "cannot write {}: directory {} is write-protected",
                locked.join("out.safetensors").display(),
                locked.display()
            ),
        ),
        (
            read_only.clone(),
            format!(
                "{} is write-protected; refusing to replace it",
                read_only.display()
            ),
        ),
    ];
    for (out, message) in &cases {
        let o = attention(&input, out, true);
        expect_exit(&o, 2);
        assert_eq!(stderr(&o).trim_end(), format!("error: {message}"));
        assert!(!computed(&o));
    }
    assert_eq!(std::fs::read(&read_only).unwrap(), b"old");
    assert_eq!(std::fs::read_dir(&locked).unwrap().count(), 0);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();

    // `msa run --json` too: refused before the case is built.
    let json = dir.join("no-such-dir").join("run.jsonl");
    let o = msa(&[
        "run",
        "--backend",
        "cpu",
        "--check",
        "none",
        "--json",
        s(&json),
    ]);
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "error: cannot write {}: directory {} does not exist",
            json.display(),
            json.parent().unwrap().display()
        )
    );
}

#[test]
fn a_failed_write_names_the_outputs_file_not_a_temporary_one() {
    // A file-size limit makes every write past it fail (EFBIG; the signal it also raises is
    // ignored so that the error is what the command sees).
    let dir = tmp_dir("efbig");
    let input = write_file("efbig-in.safetensors", &inputs(25));
    let out = dir.join("out.safetensors");
    let args = [
        "attention",
        "--inputs",
        s(&input),
        "--outputs",
        s(&out),
        "--backend",
        "cpu",
    ];
    let o = msa_in_sh("trap '' XFSZ; ulimit -f 64", &args);
    expect_exit(&o, 2);
    let err = stderr(&o);
    let last = err.lines().last().unwrap();
    assert_eq!(
        last,
        format!(
            "error: cannot write {}: File too large (os error 27)",
            out.display()
        ),
        "{err}"
    );
    assert!(!err.contains("not a valid safetensors file"), "{err}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no temporary file is left"
    );
}

/// A one-case manifest of the small pack, for quick runs.
fn small_manifest(name: &str) -> PathBuf {
    let manifest = tmp(name);
    std::fs::write(&manifest, manifest_line(7, &small_pack()) + "\n").unwrap();
    manifest
}

#[test]
fn run_json_refuses_an_existing_file_and_the_manifest() {
    let manifest = small_manifest("json-manifest.jsonl");
    let text = std::fs::read(&manifest).unwrap();
    let base = [
        "run",
        "--manifest",
        s(&manifest),
        "--case",
        "7",
        "--rank",
        "1",
        "--backend",
        "cpu",
        "--check",
        "none",
    ];
    // The manifest being read is never the --json file, --force or not.
    for force in [&[][..], &["--force"]] {
        let o = msa(&[&base[..], &["--json", s(&manifest)], force].concat());
        expect_exit(&o, 2);
        assert_eq!(
            stderr(&o).trim_end(),
            format!(
                "error: {0} is the input file {0}; write to another path",
                manifest.display()
            )
        );
        assert_eq!(std::fs::read(&manifest).unwrap(), text);
    }
    let json = tmp("json-existing.jsonl");
    std::fs::write(&json, b"earlier results\n").unwrap();
    let o = msa(&[&base[..], &["--json", s(&json)]].concat());
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "error: {} already exists (overwrite it with force)",
            json.display()
        )
    );
    assert!(!stdout(&o).contains("case7"), "refused before the run");
    assert_eq!(std::fs::read(&json).unwrap(), b"earlier results\n");
    let o = msa(&[&base[..], &["--json", s(&json), "--force"]].concat());
    expect_exit(&o, 0);
    let record: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&json).unwrap().trim()).unwrap();
    assert_eq!(record["case"], "case7/r1/recent16/s0");
}

// ---- resources ---------------------------------------------------------------------------------

#[test]
fn a_huge_case_is_refused_before_it_is_built() {
    // One document of 2^25 tokens: each rank holds 2^21 queries in 2,048 fragments whose K
    // ranges add up to about 2^28 CSR rows. Built, it grows the process past 24 GB; under a
    // 4 GB address-space limit it used to abort in the allocator.
    let manifest = tmp("huge.jsonl");
    std::fs::write(&manifest, manifest_line(1, &[0, 1 << 25]) + "\n").unwrap();
    let case = ["--manifest", s(&manifest), "--case", "1"];
    let plan = [&["plan"][..], &case].concat();
    let run = [&["run"][..], &case, &["--backend", "cpu"]].concat();
    for args in [plan, run] {
        let o = msa_in_sh("ulimit -v 4000000", &args);
        expect_exit(&o, 2);
        let err = stderr(&o);
        let last = err.lines().last().unwrap();
        assert!(
            last.starts_with("error: case 1 rank 0 (2097152 queries, ")
                && last.contains(" needs about ")
                && last.contains(" of memory, over the limit of ")
                && last.contains("of the ")
                && last.ends_with("set another limit with --memory-limit or MSA_MEMORY_LIMIT"),
            "{err}"
        );
    }
    // The limit can be given; the real cases fit the default.
    let o = msa(&["plan", "--memory-limit", "1M"]);
    expect_exit(&o, 2);
    assert!(
        stderr(&o).contains("over the limit of 1.0 MiB (given)"),
        "{}",
        stderr(&o)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_msa"))
        .args(["plan", "--case", "434"])
        .env("MSA_MEMORY_LIMIT", "2M")
        .output()
        .unwrap();
    expect_exit(&o, 2);
    assert!(
        stderr(&o).contains("over the limit of 2.0 MiB (given)"),
        "{}",
        stderr(&o)
    );
    let o = msa(&["plan", "--memory-limit", "lots"]);
    expect_exit(&o, 2);
    assert_invalid_value(&o, "lots", "--memory-limit");
}

#[test]
fn inputs_that_never_end_or_do_not_fit_are_refused_before_they_are_read() {
    let out = tmp("zero-out.safetensors");
    let args = |input: &'static str| {
        vec![
            "attention",
            "--inputs",
            input,
            "--outputs",
            s(&out),
            "--backend",
            "cpu",
        ]
    };
    let o = msa_in_sh("ulimit -v 4000000", &args("/dev/zero"));
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        "error: /dev/zero is a character device, not a regular file"
    );
    // A file of the size its header declares (a hole), over a given limit.
    let big = tmp("big.safetensors");
    let header = r#"{"q":{"dtype":"BF16","shape":[65536,64,128],"data_offsets":[0,1073741824]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let len = bytes.len() as u64 + (1 << 30);
    std::fs::write(&big, bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(len)
        .unwrap();
    let o = msa(&[
        "attention",
        "--inputs",
        s(&big),
        "--outputs",
        s(&out),
        "--backend",
        "cpu",
        "--memory-limit",
        "1G",
    ]);
    let _ = std::fs::remove_file(&big);
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "error: reading {} ({len} bytes) needs about 2.0 GiB of memory, over the limit of \
             1.0 GiB (given); set another limit with --memory-limit or MSA_MEMORY_LIMIT",
            big.display()
        )
    );
    assert!(!out.exists());
}

#[test]
fn plan_bounds_the_sm_count() {
    for sms in ["18446744073709551615", "1000000000000", "0", "65537"] {
        let o = msa(&["plan", "--sms", sms]);
        expect_exit(&o, 2);
        assert_invalid_value(&o, sms, "--sms");
    }
    expect_exit(&msa(&["plan", "--sms", "65536"]), 0);
}

// ---- messages ----------------------------------------------------------------------------------

#[test]
fn a_wrong_total_is_named_before_the_query_limit() {
    let mut tensors = inputs(26);
    for t in tensors.iter_mut() {
        if t.0 == "cu_seqlens_q" || t.0 == "cu_seqlens_k" {
            t.3 = i32_bytes(&[0, 3, 1_000_000_000]);
        }
    }
    let input = write_file("total-in.safetensors", &tensors);
    let o = attention(&input, &tmp("total-out.safetensors"), false);
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        "error: inconsistent sizes: cu_seqlens_q[B] = 1000000000 but `q` has T = 8"
    );
}

#[cfg(not(feature = "msa"))]
#[test]
fn info_says_the_cpu_backend_works_and_how_to_build_the_kernels() {
    let o = msa(&["info"]);
    expect_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("backend cpu: available"), "{out}");
    assert!(
        out.contains("to build the CUDA kernels: `cargo xtask build-kernels`, then build or run with `--features msa`"),
        "{out}"
    );
}

// ---- bench: suites and JSON ---------------------------------------------------------------------

#[test]
fn bench_takes_a_suite_and_checks_its_json_path_before_the_gpu() {
    let o = msa(&["bench", "--suite", "dev", "--case", "434"]);
    expect_exit(&o, 2);
    assert!(
        stderr(&o)
            .contains("the argument '--suite <dev|FILE>' cannot be used with '--case <CASE>'"),
        "{}",
        stderr(&o)
    );
    let missing = tmp("no-suite.json");
    let o = msa(&["bench", "--suite", s(&missing)]);
    expect_exit(&o, 2);
    assert!(
        stderr(&o).starts_with(&format!("error: cannot read {}: ", missing.display())),
        "{}",
        stderr(&o)
    );
    let json = tmp("bench-existing.jsonl");
    std::fs::write(&json, b"earlier\n").unwrap();
    let o = msa(&["bench", "--suite", "dev", "--json", s(&json)]);
    expect_exit(&o, 2);
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "error: {} already exists (overwrite it with force)",
            json.display()
        )
    );
    assert_eq!(std::fs::read(&json).unwrap(), b"earlier\n");
    let suite = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/cases/dev_bench.json");
    let o = msa(&["bench", "--suite", "dev", "--json", s(&suite), "--force"]);
    expect_exit(&o, 2);
    assert!(
        stderr(&o).contains("dev_bench.json is the input file"),
        "{}",
        stderr(&o)
    );
    #[cfg(not(feature = "msa"))]
    {
        let o = msa(&["bench", "--suite", "dev", "--json", s(&json), "--force"]);
        expect_exit(&o, 2);
        assert!(
            stderr(&o).contains("error: msa-rs was built without CUDA support"),
            "{}",
            stderr(&o)
        );
    }
}
