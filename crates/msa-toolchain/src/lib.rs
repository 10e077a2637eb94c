//! The nvcc + CUTLASS toolchain that builds the msa-rs kernels.
//!
//! [`discover`] finds one (explicit environment variables first, then `nvcc` on `PATH`, then the
//! per-user cache); [`install_pinned`] fills the cache from pinned PyPI wheels. The nvcc flags
//! live here so that `build.rs` (through `cc`) and `cargo xtask build-kernels` (compile-only)
//! compile the same way, and [`cache`] names each compiled object by the hash of everything
//! that goes into it, so both reuse unchanged translation units.
//!
//! Modules: `flags` (architectures, nvcc flags, the translation units), `discover` (finding a
//! toolkit and CUTLASS), `install` (the pinned PyPI install), all re-exported here, and
//! [`cache`] (the object cache).

use std::io;
use std::path::PathBuf;

pub mod cache;
mod discover;
mod flags;
mod install;

pub use discover::{cache_dir, discover, Source, Toolchain, ENV_VARS};
pub use flags::{
    built_targets, common_flags, kernel_sources, Arch, ARCHS, COMMON_FLAGS, PTXAS_VERBOSE_VAR,
};
pub use install::{install_pinned, CUDA_VERSION, PINNED_PACKAGES};

const HELP: &str = "Run `cargo xtask build-kernels` to install the pinned toolchain \
(nvcc 13.0.88 + CUTLASS 4.2.0 from PyPI) into the per-user cache, or set CUDA_HOME (or NVCC) \
to a CUDA 13.0 toolkit and CUTLASS_DIR to a CUTLASS 4.2 checkout.";

#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    #[error("no CUDA toolchain found (looked at: {searched}). {HELP}")]
    NotFound { searched: String },
    #[error(
        "{var}={} is not usable: {problem}. Fix or unset {var}; unset, the toolchain comes from \
         PATH or the pinned one that `cargo xtask build-kernels` installs",
        path.display()
    )]
    BadToolkit {
        var: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("CUTLASS headers not found (looked at: {searched}). {HELP}")]
    CutlassNotFound { searched: String },
    #[error(
        "cannot place the per-user toolchain cache: none of MSA_TOOLCHAIN_DIR, XDG_CACHE_HOME, \
         HOME is set"
    )]
    NoCacheDir,
    #[error("installing the pinned toolchain into {} failed: {message}", dir.display())]
    Install { dir: PathBuf, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl ToolchainError {
    /// Whether installing the pinned toolchain could fix this (nothing was configured wrongly).
    pub fn is_missing(&self) -> bool {
        matches!(
            self,
            ToolchainError::NotFound { .. } | ToolchainError::CutlassNotFound { .. }
        )
    }
}

fn io_error(context: String, source: io::Error) -> ToolchainError {
    ToolchainError::Io { context, source }
}

/// Fixtures shared by the tests of every module: temporary directories and fake toolkits.
#[cfg(test)]
mod test_util {
    use std::collections::HashMap;
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::discover::{cache_cuda_home, cache_cutlass_include, discover_with};
    use crate::{Toolchain, ToolchainError};

    /// A directory removed on drop; unique per test so tests run in parallel.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new() -> TempDir {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "msa-toolchain-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    /// A fake toolkit: executable bin/nvcc, include/cuda_runtime.h, include/cccl, `lib`.
    pub fn fake_cuda(home: &Path, lib: &str) {
        let nvcc = home.join("bin/nvcc");
        touch(&nvcc);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        touch(&home.join("include/cuda_runtime.h"));
        std::fs::create_dir_all(home.join("include/cccl")).unwrap();
        touch(&home.join(lib).join("libcudart_static.a"));
    }

    pub fn fake_cache(cache: &Path) {
        fake_cuda(&cache_cuda_home(cache), "lib");
        touch(&cache_cutlass_include(cache).join("cutlass/cutlass.h"));
    }

    pub fn discover_in(vars: &[(&str, &Path)]) -> Result<Toolchain, ToolchainError> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        discover_with(&move |key| map.get(key).cloned())
    }
}
