//! `cargo xtask gpu-bundle [--out DIR]`: the stripped `msa` CLI and GPU suite plus the runner
//! (scripts/gpu-run.sh as `run.sh`) and its PyTorch helpers, ready to copy to a GPU machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MAX_BYTES: u64 = 64 << 20;

/// Committed scripts the bundle carries: the runner (as `run.sh`) and what it calls.
const SCRIPTS: [(&str, &str); 3] = [
    ("scripts/gpu-run.sh", "run.sh"),
    ("scripts/torch_inputs.py", "torch_inputs.py"),
    ("scripts/bench_peers.py", "bench_peers.py"),
];

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
            "msa-cli",
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
    for (src, name) in SCRIPTS {
        let dst = out.join(name);
        std::fs::copy(root.join(src), &dst).map_err(|e| format!("copying {src}: {e}"))?;
        make_executable(&dst)?;
    }

    let mut bytes = 0;
    let names = ["msa", "gpu-suite"]
        .into_iter()
        .chain(SCRIPTS.iter().map(|(_, name)| *name));
    for name in names {
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
        "gpu-bundle: {} ({mib:.1} MiB): msa, gpu-suite, run.sh, torch_inputs.py, bench_peers.py; run `run.sh OUTDIR` on the GPU host",
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
