//! Helpers shared by the CLI's integration tests.

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn msa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_msa"))
        .args(args)
        .output()
        .expect("the msa binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code `code`, else a panic showing both streams.
pub fn expect_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
}

/// A fresh path in the target's scratch directory, prefixed by the test binary's name (the
/// test binaries run at once).
pub fn tmp(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}-{name}", env!("CARGO_CRATE_NAME")));
    let _ = std::fs::remove_file(&p);
    p
}

/// A manifest line in MSA's format, with every metric recomputed here from `cu`.
pub fn manifest_line(case_id: u64, cu: &[i32]) -> String {
    let mut lens: Vec<u64> = cu.windows(2).map(|w| (w[1] - w[0]) as u64).collect();
    lens.sort_unstable();
    let n = lens.len();
    let median = if n % 2 == 1 {
        lens[n / 2]
    } else {
        (lens[n / 2 - 1] + lens[n / 2]) / 2
    };
    let metrics = serde_json::json!({
        "total_tokens": lens.iter().sum::<u64>(),
        "num_sequences": n,
        "min_seqlen": lens[0],
        "median_seqlen": median,
        "max_seqlen": lens[n - 1],
        "causal_elements": lens.iter().map(|l| l * (l + 1) / 2).sum::<u64>(),
    });
    serde_json::json!({"case_id": case_id, "cu_seqlens": cu, "metrics": metrics}).to_string()
}
