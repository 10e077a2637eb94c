//! `cargo xtask wheel [--out DIR]`: the msa-torch wheel (`maturin build --release` of
//! crates/msa-torch: the Python package `msa_torch` with the extension `msa_torch._C`, abi3 for
//! CPython >= 3.10, the CUDA kernels linked in statically), printed with its path and size.
//!
//! maturin comes from `$MATURIN` (an executable) if set, else from the per-user cache
//! (`~/.cache/msa-rs/maturin-<version>`, `$XDG_CACHE_HOME` honoured), installed there on first
//! use with `python3 -m pip install --target` (as `build-kernels` installs nvcc).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned maturin (PyPI).
pub const MATURIN_VERSION: &str = "1.16.0";

pub fn run(args: &[String]) -> Result<(), String> {
    let root = crate::repo_root();
    let out = match args {
        [] => root.join("target").join("wheels"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => return crate::no_more_args(args),
    };
    // build.rs only discovers; install here so a fresh machine builds the wheel in one step.
    crate::ensure_toolchain("wheel")?;
    let maturin = ensure_maturin()?;
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let before = wheels_in(&out)?;

    let manifest = root.join("crates").join("msa-torch").join("Cargo.toml");
    println!(
        "wheel: {} build --release -m {} --out {}",
        maturin.display(),
        manifest.display(),
        out.display()
    );
    let status = Command::new(&maturin)
        .args(["build", "--release", "--manifest-path"])
        .arg(&manifest)
        .arg("--out")
        .arg(&out)
        // Only the abi3 tag matters; the interpreter found first serves (no libpython link).
        .args(["--interpreter", "python3"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("running {}: {e}", maturin.display()))?;
    if !status.success() {
        return Err(format!("maturin build failed ({status})"));
    }

    let wheel = wheels_in(&out)?
        .into_iter()
        .filter(|(path, modified)| !before.iter().any(|(p, m)| p == path && m == modified))
        .max_by_key(|(_, modified)| *modified)
        .map(|(path, _)| path)
        .ok_or_else(|| {
            format!(
                "maturin wrote no new msa_torch wheel into {}",
                out.display()
            )
        })?;
    let bytes = wheel
        .metadata()
        .map_err(|e| format!("{}: {e}", wheel.display()))?
        .len();
    println!(
        "wheel: {} ({:.1} MiB); install with `pip install {}` (needs torch >= 2.4 and an NVIDIA \
         driver >= 580)",
        wheel.display(),
        bytes as f64 / (1 << 20) as f64,
        wheel.display()
    );
    Ok(())
}

/// The msa_torch wheels in `dir` with their modification times.
fn wheels_in(dir: &Path) -> Result<Vec<(PathBuf, std::time::SystemTime)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut wheels = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("msa_torch-") && name.ends_with(".whl") {
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            wheels.push((path, modified));
        }
    }
    Ok(wheels)
}

/// `$MATURIN`, else the cached pinned maturin (installed on first use).
fn ensure_maturin() -> Result<PathBuf, String> {
    if let Some(exe) = std::env::var_os("MATURIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(exe));
    }
    let dir = cache_dir()?;
    let exe = dir.join("bin").join("maturin");
    if exe.is_file() {
        return Ok(exe);
    }
    println!(
        "wheel: installing maturin {MATURIN_VERSION} into {}",
        dir.display()
    );
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let tmp = parent.join(format!(
        ".maturin-{MATURIN_VERSION}.partial-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
        .arg(&tmp)
        .arg(format!("maturin=={MATURIN_VERSION}"))
        .status()
        .map_err(|e| {
            format!("running python3 -m pip: {e} (install python3 and pip, or set MATURIN)")
        })?;
    if !status.success() || !tmp.join("bin").join("maturin").is_file() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(format!(
            "`python3 -m pip install --target {} maturin=={MATURIN_VERSION}` failed ({status}); \
             set MATURIN to a maturin executable instead",
            tmp.display()
        ));
    }
    if dir.exists() {
        // A concurrent install finished first, or a broken directory: keep ours out of the way.
        let _ = std::fs::remove_dir_all(&tmp);
        return if exe.is_file() {
            Ok(exe)
        } else {
            Err(format!(
                "{} exists but holds no bin/maturin; remove it and retry",
                dir.display()
            ))
        };
    }
    std::fs::rename(&tmp, &dir)
        .map_err(|e| format!("moving {} to {}: {e}", tmp.display(), dir.display()))?;
    Ok(exe)
}

/// `$XDG_CACHE_HOME/msa-rs/maturin-<version>`, else `~/.cache/msa-rs/maturin-<version>`.
fn cache_dir() -> Result<PathBuf, String> {
    let leaf = format!("maturin-{MATURIN_VERSION}");
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        Ok(Path::new(&xdg).join("msa-rs").join(leaf))
    } else if let Some(home) = var("HOME") {
        Ok(Path::new(&home).join(".cache").join("msa-rs").join(leaf))
    } else {
        Err("neither XDG_CACHE_HOME nor HOME is set: set MATURIN to a maturin executable".into())
    }
}
