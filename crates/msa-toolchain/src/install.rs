//! The pinned toolchain: nvcc, the CUDA headers, static cudart and CUTLASS as PyPI wheels,
//! installed into the per-user cache that [`crate::discover`] looks at last.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::discover::from_cache;
use crate::{cache_dir, io_error, Toolchain, ToolchainError};

/// CUDA version of the pinned toolchain; driver 580 is CUDA 13.0, so newer PTX would not load.
pub const CUDA_VERSION: &str = "13.0.88";

/// The wheels [`install_pinned`] installs (`pip install --no-deps`, so the list is complete).
pub const PINNED_PACKAGES: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cutlass==4.2.0.0",
];

/// Installs [`PINNED_PACKAGES`] into [`cache_dir`] with `python3 -m pip install --no-deps
/// --target`, into a temporary sibling directory that is renamed into place once complete, so
/// an interrupted install never leaves a half toolchain behind. A complete cache is reused.
/// Returns the cached toolchain (which [`discover`](crate::discover) may still rank below `CUDA_HOME` etc.).
pub fn install_pinned(progress: &mut dyn FnMut(&str)) -> Result<Toolchain, ToolchainError> {
    install_into(&cache_dir()?, "python3", progress)
}

fn install_into(
    dir: &Path,
    python: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Toolchain, ToolchainError> {
    if let Ok(tc) = from_cache(dir) {
        progress(&format!("reusing the toolchain in {}", dir.display()));
        return Ok(tc);
    }
    let fail = |message: String| ToolchainError::Install {
        dir: dir.to_path_buf(),
        message,
    };
    if dir.exists() {
        // Never delete a directory we did not create: MSA_TOOLCHAIN_DIR may point anywhere.
        return Err(fail(format!(
            "{} exists but is not a complete toolchain; remove it and retry",
            dir.display()
        )));
    }
    let pip_ok = Command::new(python)
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !pip_ok {
        return Err(fail(format!(
            "`{python} -m pip` is not available; install python3 and pip (Debian: apt-get install \
             python3-pip), or set CUDA_HOME/NVCC and CUTLASS_DIR to an existing toolkit"
        )));
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .map_err(|e| io_error(format!("creating {}", parent.display()), e))?;
    let leaf = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        leaf.as_deref().unwrap_or("toolchain"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let cleanup = |tmp: &Path| {
        let _ = std::fs::remove_dir_all(tmp);
    };

    progress(&format!(
        "installing the pinned CUDA {CUDA_VERSION} + CUTLASS toolchain (about 300 MB) into {}: {}",
        dir.display(),
        PINNED_PACKAGES.join(" ")
    ));
    let start = Instant::now();
    let out = Command::new(python)
        .args(["-m", "pip", "install", "--no-deps", "--no-input"])
        .args([
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--target",
        ])
        .arg(&tmp)
        .args(PINNED_PACKAGES)
        .output()
        .map_err(|e| io_error(format!("running {python} -m pip"), e))?;
    if !out.status.success() {
        cleanup(&tmp);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(fail(format!(
            "pip exited with {}; if this host is offline or behind a proxy, configure pip \
             (PIP_INDEX_URL, HTTPS_PROXY) or install the wheels elsewhere with `pip install \
             --no-deps --target {} {}`\n{}",
            out.status,
            dir.display(),
            PINNED_PACKAGES.join(" "),
            tail.join("\n")
        )));
    }
    if let Err(problem) = from_cache(&tmp) {
        cleanup(&tmp);
        return Err(fail(format!(
            "pip succeeded but the wheels are incomplete: {problem}"
        )));
    }
    if let Err(e) = std::fs::rename(&tmp, dir) {
        cleanup(&tmp);
        // Another process may have finished the same install first.
        return from_cache(dir).map_err(|_| {
            fail(format!(
                "moving {} to {}: {e}",
                tmp.display(),
                dir.display()
            ))
        });
    }
    progress(&format!(
        "installed in {:.0} s",
        start.elapsed().as_secs_f64()
    ));
    from_cache(dir).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{fake_cache, touch, TempDir};
    use crate::Source;

    #[test]
    fn install_reuses_a_complete_cache_and_reports_missing_pip() {
        let t = TempDir::new();
        let cache = t.0.join("cache");
        fake_cache(&cache);
        let mut messages = Vec::new();
        let tc = install_into(&cache, "python-that-does-not-exist", &mut |m| {
            messages.push(m.to_string())
        })
        .unwrap();
        assert_eq!(tc.source, Source::Cache);
        assert!(messages[0].starts_with("reusing"), "{messages:?}");

        let fresh = t.0.join("fresh");
        let err = install_into(&fresh, "python-that-does-not-exist", &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("pip` is not available"), "{err}");
        assert!(!fresh.exists());

        // A directory that is there but incomplete is never deleted.
        let partial = t.0.join("partial");
        touch(&partial.join("keep.txt"));
        let err = install_into(&partial, "python3", &mut |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("not a complete toolchain"),
            "{err}"
        );
        assert!(partial.join("keep.txt").exists());
    }
}
