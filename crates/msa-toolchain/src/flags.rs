//! Architectures and nvcc flags of every kernel compile, shared by `build.rs` (through `cc`)
//! and `cargo xtask build-kernels` (compile-only) so that both compile the same way, and the
//! list of kernel translation units.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::{io_error, Toolchain, ToolchainError};

/// One nvcc `-gencode` and the targets (SASS `sm_*`, PTX `compute_*`) it embeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    pub name: &'static str,
    pub gencode: &'static str,
    pub targets: &'static [&'static str],
}

/// Architectures every kernel is built for. `sm_90a` needs the explicit gencode: the `-arch`
/// shorthand fails with nvcc 13.0. The `compute_80` PTX lets newer GPUs (Blackwell) JIT.
pub const ARCHS: &[Arch] = &[
    Arch {
        name: "sm_90a",
        gencode: "-gencode=arch=compute_90a,code=sm_90a",
        targets: &["sm_90a"],
    },
    Arch {
        name: "sm_80",
        gencode: "-gencode=arch=compute_80,code=[sm_80,compute_80]",
        targets: &["sm_80", "compute_80"],
    },
];

/// Flags of every nvcc compile. Host warnings are on for our sources; third-party headers are
/// included with `-isystem` ([`Toolchain::nvcc_flags`]) because CUTLASS floods `-Wextra`.
pub const COMMON_FLAGS: &[&str] = &[
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-lineinfo",
    "-Xcompiler=-Wall,-Wextra",
];

/// Set (to anything but `0`) to add `-Xptxas=-v`: register and spill report per kernel.
pub const PTXAS_VERBOSE_VAR: &str = "MSA_PTXAS_VERBOSE";

/// The targets compiled in, as `MSA_KERNEL_ARCHS` spells them: `sm_90a,sm_80,compute_80`.
pub fn built_targets() -> String {
    ARCHS
        .iter()
        .flat_map(|a| a.targets.iter().copied())
        .collect::<Vec<_>>()
        .join(",")
}

/// [`COMMON_FLAGS`], plus `-Xptxas=-v` when [`PTXAS_VERBOSE_VAR`] asks for it.
pub fn common_flags() -> Vec<String> {
    let mut flags: Vec<String> = COMMON_FLAGS.iter().map(|f| f.to_string()).collect();
    if std::env::var_os(PTXAS_VERBOSE_VAR).is_some_and(|v| !v.is_empty() && v != "0") {
        flags.push("-Xptxas=-v".into());
    }
    flags
}

/// Every `.cu` file under `dir` (recursively), sorted: the translation units of the kernels.
pub fn kernel_sources(dir: &Path) -> Result<Vec<PathBuf>, ToolchainError> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "cu") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, &mut out).map_err(|e| io_error(format!("listing {}", dir.display()), e))?;
    out.sort();
    Ok(out)
}

impl Toolchain {
    /// [`common_flags`], the toolkit and CUTLASS headers as system includes, and the
    /// `MSA_KERNEL_ARCHS` macro (`msa_kernels_archs()` returns it). No `-gencode`: callers add
    /// one per [`Arch`] (xtask) or all of them (build.rs).
    pub fn nvcc_flags(&self) -> Vec<OsString> {
        let mut flags: Vec<OsString> = common_flags().into_iter().map(OsString::from).collect();
        for dir in self.include_dirs.iter().chain([&self.cutlass_include]) {
            flags.push("-isystem".into());
            flags.push(dir.into());
        }
        flags.push(format!("-DMSA_KERNEL_ARCHS=\"{}\"", built_targets()).into());
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{touch, TempDir};
    use crate::Source;

    #[test]
    fn kernel_sources_are_recursive_and_sorted() {
        let t = TempDir::new();
        for f in ["b.cu", "a/z.cu", "a.cu", "x.cuh", "readme.md"] {
            touch(&t.0.join(f));
        }
        let found = kernel_sources(&t.0).unwrap();
        let found: Vec<&Path> = found
            .iter()
            .map(|p| p.strip_prefix(&t.0).unwrap())
            .collect();
        assert_eq!(
            found,
            [Path::new("a/z.cu"), Path::new("a.cu"), Path::new("b.cu")]
        );
        assert!(kernel_sources(&t.0.join("missing")).is_err());
    }

    #[test]
    fn flags_and_targets() {
        assert_eq!(built_targets(), "sm_90a,sm_80,compute_80");
        let tc = Toolchain {
            cuda_home: "/cuda".into(),
            nvcc: "/cuda/bin/nvcc".into(),
            include_dirs: vec!["/cuda/include".into(), "/cuda/include/cccl".into()],
            cutlass_include: "/cutlass/include".into(),
            lib_dir: "/cuda/lib".into(),
            source: Source::Cache,
        };
        let flags = tc.nvcc_flags();
        let flags: Vec<&str> = flags.iter().map(|f| f.to_str().unwrap()).collect();
        assert_eq!(&flags[..COMMON_FLAGS.len()], COMMON_FLAGS);
        let systems: Vec<&str> = flags
            .windows(2)
            .filter(|w| w[0] == "-isystem")
            .map(|w| w[1])
            .collect();
        assert_eq!(
            systems,
            ["/cuda/include", "/cuda/include/cccl", "/cutlass/include"]
        );
        assert_eq!(
            flags.last().copied(),
            Some("-DMSA_KERNEL_ARCHS=\"sm_90a,sm_80,compute_80\"")
        );
    }
}
