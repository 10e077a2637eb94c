//! The object cache of the kernel build, shared by `build.rs` and `cargo xtask build-kernels`
//! (candle's `CANDLE_FLASH_ATTN_BUILD_DIR` idea, made content-addressed).
//!
//! Every translation unit's object is stored as `<stem>-<key>.o`, where the key hashes everything
//! that goes into the object: the compiler identity ([`compiler_fingerprint`]: nvcc's path and
//! `--version`, the host compiler's `--version`, every flag and `-gencode`, the `NVCC_*`
//! variables nvcc reads) and the source with every header it includes from the kernel tree
//! ([`object_key`]). An unchanged translation unit is reused from the cache, so editing one
//! kernel recompiles one file, and a header recompiles exactly the files that include it.
//! Objects are written under a temporary name and renamed into place, so concurrent builds
//! (clippy and test, two profiles) share the directory safely. Nothing is ever evicted: remove
//! the directory (or `cargo clean`) to reclaim the space.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{io_error, ToolchainError};

/// Overrides the cache directory (default: `msa-kernels-cache` in the cargo target directory).
pub const BUILD_DIR_VAR: &str = "MSA_KERNELS_BUILD_DIR";

/// Variables nvcc itself reads: they change the compile without changing its command line.
pub const NVCC_ENV_VARS: &[&str] = &["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"];

/// FNV-1a over 128 bits: a fixed, documented function (the key must not change between Rust
/// releases, as std's `DefaultHasher` may), collision-free in practice for a build cache.
#[derive(Debug, Clone)]
struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn new() -> Self {
        Fnv128(Self::OFFSET)
    }

    fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// One length-prefixed field, so that field boundaries are part of the hash.
    fn field(&mut self, data: &[u8]) {
        self.bytes(&(data.len() as u64).to_le_bytes());
        self.bytes(data);
    }

    fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

/// `<target dir>/msa-kernels-cache`, or `$MSA_KERNELS_BUILD_DIR` when set and non-empty.
pub fn build_dir(target_dir: &Path) -> PathBuf {
    match std::env::var_os(BUILD_DIR_VAR).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => target_dir.join("msa-kernels-cache"),
    }
}

/// The cargo target directory of a build script's `OUT_DIR`
/// (`<target>[/<triple>]/<profile>/build/<pkg>-<hash>/out`), shared by every profile.
pub fn target_dir_of_out_dir(out_dir: &Path) -> Option<PathBuf> {
    let build = out_dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))?;
    Some(build.parent()?.parent()?.to_path_buf())
}

/// Output of `program --version` (stdout and stderr), or the error text when it cannot run.
fn version_text(program: &Path) -> Vec<u8> {
    match Command::new(program).arg("--version").output() {
        Ok(out) => [out.stdout, out.stderr].concat(),
        Err(e) => format!("cannot run {}: {e}", program.display()).into_bytes(),
    }
}

/// The identity of one compiler invocation without its input: nvcc (`path`, `--version`), the
/// host compiler nvcc drives (`-ccbin=` in `args`, else `NVCC_CCBIN`, else `c++`; its
/// `--version`), every argument, and [`NVCC_ENV_VARS`]. Computed once per build.
pub fn compiler_fingerprint(nvcc: &Path, args: &[OsString]) -> String {
    let mut h = Fnv128::new();
    h.field(b"msa-kernels object cache v1");
    h.field(&os_bytes(nvcc.as_os_str()));
    h.field(&version_text(nvcc));
    let ccbin = args
        .iter()
        .find_map(|a| a.to_str()?.strip_prefix("-ccbin=").map(PathBuf::from))
        .or_else(|| std::env::var_os("NVCC_CCBIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("c++"));
    h.field(&os_bytes(ccbin.as_os_str()));
    h.field(&version_text(&ccbin));
    h.field(&(args.len() as u64).to_le_bytes());
    for arg in args {
        h.field(&os_bytes(arg));
    }
    for var in NVCC_ENV_VARS {
        h.field(var.as_bytes());
        h.field(
            &std::env::var_os(var)
                .map(|v| os_bytes(&v))
                .unwrap_or_default(),
        );
    }
    h.hex()
}

/// The target of an `#include "x"` or `#include <x>` line, if the line is one.
fn include_target(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let rest = rest.strip_prefix("include")?.trim_start();
    let (open, close) = match rest.chars().next()? {
        '"' => ('"', '"'),
        '<' => ('<', '>'),
        _ => return None,
    };
    let rest = rest.strip_prefix(open)?;
    rest.find(close).map(|end| &rest[..end])
}

/// Every header `src` includes, directly or not, that lies in the kernel tree: each include is
/// resolved as nvcc does for quoted includes (the including file's directory, then
/// `include_dirs` in order; angle includes only in `include_dirs`). Includes found nowhere there
/// are toolkit or CUTLASS headers, which [`compiler_fingerprint`] covers. Sorted, without `src`.
pub fn local_includes(
    src: &Path,
    include_dirs: &[PathBuf],
) -> Result<Vec<PathBuf>, ToolchainError> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(file) = todo.pop() {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| io_error(format!("reading {}", file.display()), e))?;
        for line in text.lines() {
            let Some(target) = include_target(line) else {
                continue;
            };
            let quoted = line.contains('"');
            let here = file.parent().filter(|_| quoted).map(Path::to_path_buf);
            let found = here
                .iter()
                .chain(include_dirs)
                .map(|dir| dir.join(target))
                .find(|p| p.is_file());
            if let Some(path) = found {
                let path = path.canonicalize().unwrap_or(path);
                if seen.insert(path.clone()) {
                    todo.push(path);
                }
            }
        }
    }
    seen.remove(src);
    Ok(seen.into_iter().collect())
}

/// The cache key of one translation unit: `fingerprint` (see [`compiler_fingerprint`]), the
/// source's path and bytes, and the path and bytes of every header of [`local_includes`].
pub fn object_key(
    fingerprint: &str,
    src: &Path,
    include_dirs: &[PathBuf],
) -> Result<String, ToolchainError> {
    let mut h = Fnv128::new();
    h.field(fingerprint.as_bytes());
    for file in std::iter::once(src.to_path_buf()).chain(local_includes(src, include_dirs)?) {
        let bytes =
            std::fs::read(&file).map_err(|e| io_error(format!("reading {}", file.display()), e))?;
        h.field(&os_bytes(file.as_os_str()));
        h.field(&bytes);
    }
    Ok(h.hex())
}

/// Moves a freshly compiled object to `dest` atomically (a rename; across file systems a copy
/// to a temporary sibling, then a rename), so a reader never sees a partial object.
pub fn store(object: &Path, dest: &Path) -> Result<(), ToolchainError> {
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| io_error(format!("creating {}", dir.display()), e))?;
    }
    if std::fs::rename(object, dest).is_ok() {
        return Ok(());
    }
    let tmp = dest.with_extension(format!(
        "o.partial-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let copy = std::fs::copy(object, &tmp).and_then(|_| std::fs::rename(&tmp, dest));
    copy.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(
            format!("storing {} as {}", object.display(), dest.display()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{touch, TempDir};

    fn write(path: &Path, text: &str) {
        touch(path);
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn fnv128_matches_the_reference_vectors() {
        let hash = |s: &str| {
            let mut h = Fnv128::new();
            h.bytes(s.as_bytes());
            h.hex()
        };
        assert_eq!(hash(""), "6c62272e07bb014262b821756295c58d");
        assert_eq!(hash("a"), "d228cb696f1a8caf78912b704e4a8964");
    }

    #[test]
    fn include_lines() {
        assert_eq!(include_target("#include \"msa/abi.h\""), Some("msa/abi.h"));
        assert_eq!(
            include_target("  #  include <cub/cub.cuh>"),
            Some("cub/cub.cuh")
        );
        assert_eq!(include_target("// #include \"x.h\""), None);
        assert_eq!(include_target("#pragma once"), None);
        assert_eq!(include_target("#include MACRO"), None);
    }

    /// kernels/{include/msa/a.h, src/common/c.cuh, src/fam/local.cuh, src/fam/k.cu}.
    fn tree(t: &TempDir) -> (PathBuf, Vec<PathBuf>) {
        let inc = t.0.join("include");
        let src = t.0.join("src");
        write(&inc.join("msa/a.h"), "#pragma once\n#include <stdint.h>\n");
        write(
            &src.join("common/c.cuh"),
            "#include \"msa/a.h\"\n#include <cub/cub.cuh>\n",
        );
        write(&src.join("fam/local.cuh"), "#include \"common/c.cuh\"\n");
        write(&src.join("fam/other.cuh"), "int unused;\n");
        write(
            &src.join("fam/k.cu"),
            "#include \"msa/a.h\"\n#include \"local.cuh\"\n#include <cuda_runtime.h>\n",
        );
        let dirs = vec![inc.canonicalize().unwrap(), src.canonicalize().unwrap()];
        (src.join("fam/k.cu").canonicalize().unwrap(), dirs)
    }

    #[test]
    fn local_includes_follow_the_include_graph_only() {
        let t = TempDir::new();
        let (k, dirs) = tree(&t);
        let found = local_includes(&k, &dirs).unwrap();
        let root = t.0.canonicalize().unwrap();
        let rel: Vec<&Path> = found
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap())
            .collect();
        assert_eq!(
            rel,
            [
                Path::new("include/msa/a.h"),
                Path::new("src/common/c.cuh"),
                Path::new("src/fam/local.cuh"),
            ]
        );
    }

    #[test]
    fn keys_change_with_sources_headers_and_flags_only() {
        let t = TempDir::new();
        let (k, dirs) = tree(&t);
        let fp = compiler_fingerprint(Path::new("/no/nvcc"), &["-O3".into()]);
        let key = object_key(&fp, &k, &dirs).unwrap();
        assert_eq!(key.len(), 32);
        assert_eq!(object_key(&fp, &k, &dirs).unwrap(), key, "deterministic");

        // A header nobody includes: same key.
        write(&t.0.join("src/fam/other.cuh"), "int changed;\n");
        assert_eq!(object_key(&fp, &k, &dirs).unwrap(), key);
        // A transitively included header: new key.
        write(
            &t.0.join("src/common/c.cuh"),
            "#include \"msa/a.h\"\n// edit\n",
        );
        let key2 = object_key(&fp, &k, &dirs).unwrap();
        assert_ne!(key2, key);
        // Another flag: new key.
        let fp2 = compiler_fingerprint(Path::new("/no/nvcc"), &["-O2".into()]);
        assert_ne!(object_key(&fp2, &k, &dirs).unwrap(), key2);
    }

    #[test]
    fn store_renames_into_place() {
        let t = TempDir::new();
        let obj = t.0.join("job/x.o");
        write(&obj, "object");
        let dest = t.0.join("cache/x-0123.o");
        store(&obj, &dest).unwrap();
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "object");
        assert!(!obj.exists());
    }

    #[test]
    fn target_dir_from_out_dir() {
        let out = Path::new("/w/target/debug/build/msa-kernels-0123/out");
        assert_eq!(target_dir_of_out_dir(out), Some(PathBuf::from("/w/target")));
        let cross = Path::new("/w/target/x86_64-unknown-linux-gnu/release/build/k-1/out");
        assert_eq!(
            target_dir_of_out_dir(cross),
            Some(PathBuf::from("/w/target/x86_64-unknown-linux-gnu"))
        );
        assert_eq!(target_dir_of_out_dir(Path::new("/tmp/out")), None);
    }
}
