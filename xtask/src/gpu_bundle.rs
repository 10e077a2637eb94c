//! `cargo xtask gpu-bundle [--out DIR]`: the stripped `msa` CLI and GPU suite plus `run.sh`,
//! ready to copy to a GPU machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MAX_BYTES: u64 = 64 << 20;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# msa-rs GPU bundle runner (written by `cargo xtask gpu-bundle`).
# usage: run.sh OUTDIR [suite args...]
# Writes OUTDIR/info.txt (`msa info`), OUTDIR/gpu-suite.log, and the suite's JSON results
# (MSA_GPU_RESULTS=OUTDIR); exits with the suite's status. Works from any directory.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "$#" -lt 1 ]; then
    echo "usage: $0 OUTDIR [suite args...]" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
shift
if ! "$here/msa" info >"$out/info.txt" 2>&1; then
    echo "run.sh: \`msa info\` failed; see $out/info.txt" >&2
fi
MSA_GPU_RESULTS="$out" "$here/gpu-suite" --test-threads=1 "$@" 2>&1 | tee "$out/gpu-suite.log"
exit "${PIPESTATUS[0]}"
"#;

pub fn run(args: &[String]) -> Result<(), String> {
    let root = crate::repo_root();
    let out = match args {
        [] => root.join(".gpu-bundle"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => return crate::no_more_args(args),
    };
    // build.rs only discovers; install here so a fresh machine can bundle in one step.
    crate::ensure_toolchain("gpu-bundle")?;

    println!("gpu-bundle: building the msa CLI (release, --features msa)");
    let msa = cargo_executable(
        &root,
        &[
            "build",
            "--release",
            "-p",
            "msa",
            "--bin",
            "msa",
            "--features",
            "msa",
        ],
        "msa",
        "bin",
    )?;
    println!("gpu-bundle: building the GPU suite (release, --features msa)");
    let suite = cargo_executable(
        &root,
        &[
            "test",
            "--release",
            "-p",
            "msa-tests",
            "--features",
            "msa",
            "--test",
            "gpu",
            "--no-run",
        ],
        "gpu",
        "test",
    )?;

    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    strip(&msa, &out.join("msa"))?;
    strip(&suite, &out.join("gpu-suite"))?;
    let runner = out.join("run.sh");
    std::fs::write(&runner, RUN_SH).map_err(|e| format!("writing {}: {e}", runner.display()))?;
    make_executable(&runner)?;

    let mut bytes = 0;
    for name in ["msa", "gpu-suite", "run.sh"] {
        let path = out.join(name);
        bytes += path
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
    }
    let mib = bytes as f64 / (1 << 20) as f64;
    if bytes > MAX_BYTES {
        return Err(format!(
            "bundle {} is {mib:.1} MiB, over the 64 MiB limit",
            out.display()
        ));
    }
    println!(
        "gpu-bundle: {} ({mib:.1} MiB): msa, gpu-suite, run.sh; run `run.sh OUTDIR` on the GPU host",
        out.display()
    );
    Ok(())
}

/// Runs a cargo build and returns the executable of the artifact `name` of `kind`.
fn cargo_executable(root: &Path, args: &[&str], name: &str, kind: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Diagnostics go to stderr as usual; stdout carries one JSON message per line.
    let out = Command::new(&cargo)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo {}` failed ({})",
            args.join(" "),
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == kind))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| {
            format!(
                "`cargo {}` produced no {kind} executable `{name}`",
                args.join(" ")
            )
        })
}

/// Copies `src` to `dst` without symbols (`strip`, else `objcopy`).
fn strip(src: &Path, dst: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(dst);
    let tries: [(&str, Vec<&std::ffi::OsStr>); 2] = [
        (
            "strip",
            vec![
                "--strip-all".as_ref(),
                "-o".as_ref(),
                dst.as_os_str(),
                src.as_os_str(),
            ],
        ),
        (
            "objcopy",
            vec!["--strip-all".as_ref(), src.as_os_str(), dst.as_os_str()],
        ),
    ];
    let mut errors = Vec::new();
    for (tool, args) in tries {
        match Command::new(tool).args(&args).output() {
            Ok(o) if o.status.success() => return make_executable(dst),
            Ok(o) => errors.push(format!(
                "{tool}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => errors.push(format!("{tool}: {e}")),
        }
    }
    Err(format!(
        "cannot strip {}: {}",
        src.display(),
        errors.join("; ")
    ))
}

fn make_executable(path: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    }
    Ok(())
}
