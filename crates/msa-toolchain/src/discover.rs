//! Finding the toolchain: the CUDA toolkit (nvcc, its headers, static cudart) and CUTLASS, from
//! the environment, `PATH` or the per-user cache that [`crate::install_pinned`] fills.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{io_error, ToolchainError, CUDA_VERSION, PTXAS_VERBOSE_VAR};

/// Every environment variable that [`discover`] or [`common_flags`](crate::common_flags) reads, for
/// `cargo:rerun-if-env-changed`. `PATH` is left out on purpose: it differs between shells and
/// IDEs, and tracking it would rebuild every kernel whenever it does.
pub const ENV_VARS: &[&str] = &[
    "CUDA_HOME",
    "CUDA_PATH",
    "NVCC",
    "CUTLASS_DIR",
    "MSA_TOOLCHAIN_DIR",
    "XDG_CACHE_HOME",
    "HOME",
    PTXAS_VERBOSE_VAR,
];

/// How [`discover`] found the CUDA toolkit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `CUDA_HOME`, or `CUDA_PATH` (the variable is named).
    Env(&'static str),
    /// `NVCC`, the path of nvcc.
    Nvcc,
    /// `nvcc` on `PATH`.
    Path,
    /// The per-user cache that [`install_pinned`](crate::install_pinned) fills.
    Cache,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(var) => f.write_str(var),
            Source::Nvcc => f.write_str("NVCC"),
            Source::Path => f.write_str("nvcc on PATH"),
            Source::Cache => f.write_str("the msa-rs toolchain cache"),
        }
    }
}

/// A usable toolchain: nvcc, its headers (CUDA + CCCL), CUTLASS, and `libcudart_static.a`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    pub cuda_home: PathBuf,
    pub nvcc: PathBuf,
    /// `{cuda_home}/include`, then `{cuda_home}/include/cccl` where it exists (CUDA 13 moved
    /// CUB/Thrust/libcu++ there).
    pub include_dirs: Vec<PathBuf>,
    /// The directory holding `cutlass/` and `cute/`.
    pub cutlass_include: PathBuf,
    /// The directory holding `libcudart_static.a`.
    pub lib_dir: PathBuf,
    pub source: Source,
}

impl Toolchain {
    /// nvcc's version, e.g. `13.0.88`, from `nvcc --version`.
    pub fn nvcc_version(&self) -> Result<String, ToolchainError> {
        let out = Command::new(&self.nvcc)
            .arg("--version")
            .output()
            .map_err(|e| io_error(format!("running {} --version", self.nvcc.display()), e))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // Last line: "Build cuda_13.0.r13.0/compiler.36424714_0"; the one before holds
        // "Cuda compilation tools, release 13.0, V13.0.88".
        text.split_whitespace()
            .find_map(|w| {
                w.strip_prefix('V')
                    .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            })
            .map(str::to_string)
            .ok_or_else(|| ToolchainError::BadToolkit {
                var: "NVCC",
                path: self.nvcc.clone(),
                problem: format!("unexpected `nvcc --version` output: {}", text.trim()),
            })
    }

    /// A warning when nvcc is not the pinned CUDA 13.0: driver 580 (CUDA 13.0) cannot load the
    /// PTX of a newer nvcc, so the `compute_80` JIT path would fail on such a host.
    pub fn version_warning(&self) -> Option<String> {
        let pinned = CUDA_VERSION
            .rsplit_once('.')
            .map_or(CUDA_VERSION, |(mm, _)| mm);
        match self.nvcc_version() {
            Ok(v) if v.starts_with(&format!("{pinned}.")) => None,
            Ok(v) => Some(format!(
                "nvcc {v} at {} is not the pinned CUDA {pinned}; kernels built with it may not \
                 load on a CUDA {pinned} driver",
                self.nvcc.display()
            )),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// Finds the toolchain. CUDA: `CUDA_HOME` (or `CUDA_PATH`), then `NVCC`, then `nvcc` on `PATH`,
/// then the cache. CUTLASS: `CUTLASS_DIR/include`, then the cache. A variable that is set but
/// points at something unusable is an error rather than skipped. Never installs.
pub fn discover() -> Result<Toolchain, ToolchainError> {
    discover_with(&|key| std::env::var_os(key))
}

/// The per-user cache: `$MSA_TOOLCHAIN_DIR`, else `$XDG_CACHE_HOME/msa-rs/toolchain-13.0.88`,
/// else `~/.cache/msa-rs/toolchain-13.0.88`.
pub fn cache_dir() -> Result<PathBuf, ToolchainError> {
    cache_dir_with(&|key| std::env::var_os(key))
}

type EnvFn<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// A variable that is unset or empty counts as unset.
fn var(env: EnvFn, key: &str) -> Option<OsString> {
    env(key).filter(|v| !v.is_empty())
}

fn cache_dir_with(env: EnvFn) -> Result<PathBuf, ToolchainError> {
    let leaf = format!("toolchain-{CUDA_VERSION}");
    if let Some(dir) = var(env, "MSA_TOOLCHAIN_DIR") {
        Ok(PathBuf::from(dir))
    } else if let Some(xdg) = var(env, "XDG_CACHE_HOME") {
        Ok(Path::new(&xdg).join("msa-rs").join(leaf))
    } else if let Some(home) = var(env, "HOME") {
        Ok(Path::new(&home).join(".cache").join("msa-rs").join(leaf))
    } else {
        Err(ToolchainError::NoCacheDir)
    }
}

/// Wheel layout inside the cache.
pub(crate) fn cache_cuda_home(cache: &Path) -> PathBuf {
    cache.join("nvidia").join("cu13")
}

pub(crate) fn cache_cutlass_include(cache: &Path) -> PathBuf {
    cache.join("cutlass_library").join("source").join("include")
}

fn nvcc_name() -> String {
    format!("nvcc{}", std::env::consts::EXE_SUFFIX)
}

/// The CUDA parts of a toolkit rooted at `home`, or what is missing.
struct Cuda {
    home: PathBuf,
    nvcc: PathBuf,
    include_dirs: Vec<PathBuf>,
    lib_dir: PathBuf,
}

fn check_cuda_home(home: &Path, nvcc: Option<PathBuf>) -> Result<Cuda, String> {
    let nvcc = nvcc.unwrap_or_else(|| home.join("bin").join(nvcc_name()));
    if !nvcc.is_file() {
        return Err(format!("no nvcc at {}", nvcc.display()));
    }
    let include = home.join("include");
    if !include.join("cuda_runtime.h").is_file() {
        return Err(format!("no cuda_runtime.h in {}", include.display()));
    }
    let cccl = include.join("cccl");
    let mut include_dirs = vec![include];
    if cccl.is_dir() {
        include_dirs.push(cccl);
    }
    let lib_dir = [
        "lib64",
        "lib",
        "targets/x86_64-linux/lib",
        "targets/sbsa-linux/lib",
    ]
    .iter()
    .map(|sub| home.join(sub))
    .find(|dir| dir.join("libcudart_static.a").is_file())
    .ok_or_else(|| format!("no libcudart_static.a under {}", home.display()))?;
    Ok(Cuda {
        home: home.to_path_buf(),
        nvcc,
        include_dirs,
        lib_dir,
    })
}

fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

fn find_cuda(env: EnvFn, cache: Option<&Path>) -> Result<(Cuda, Source), ToolchainError> {
    for key in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = var(env, key) {
            let home = PathBuf::from(home);
            return check_cuda_home(&home, None)
                .map(|c| (c, Source::Env(key)))
                .map_err(|problem| ToolchainError::BadToolkit {
                    var: key,
                    path: home,
                    problem,
                });
        }
    }
    if let Some(nvcc) = var(env, "NVCC") {
        let nvcc = PathBuf::from(nvcc);
        let home = nvcc.parent().and_then(Path::parent).map(Path::to_path_buf);
        return match home {
            Some(home) => check_cuda_home(&home, Some(nvcc.clone())),
            None => Err("expected a path like <cuda>/bin/nvcc".into()),
        }
        .map(|c| (c, Source::Nvcc))
        .map_err(|problem| ToolchainError::BadToolkit {
            var: "NVCC",
            path: nvcc,
            problem,
        });
    }
    let mut searched = vec!["CUDA_HOME, CUDA_PATH, NVCC (unset)".to_string()];
    // An implicit nvcc on PATH that is not a complete toolkit is skipped, not an error.
    let on_path = var(env, "PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(nvcc_name()))
        .find(|nvcc| is_executable(nvcc));
    match on_path {
        Some(nvcc) => {
            // Resolve symlinks (/usr/local/bin/nvcc -> /usr/local/cuda/bin/nvcc) to find the
            // toolkit root.
            let real = nvcc.canonicalize().unwrap_or_else(|_| nvcc.clone());
            let home = real
                .parent()
                .and_then(Path::parent)
                .unwrap_or(Path::new("/"));
            match check_cuda_home(home, Some(real.clone())) {
                Ok(c) => return Ok((c, Source::Path)),
                Err(problem) => searched.push(format!("{} on PATH ({problem})", nvcc.display())),
            }
        }
        None => searched.push("PATH (no nvcc)".into()),
    }
    if let Some(cache) = cache {
        match check_cuda_home(&cache_cuda_home(cache), None) {
            Ok(c) => return Ok((c, Source::Cache)),
            Err(problem) => searched.push(format!("cache {} ({problem})", cache.display())),
        }
    }
    Err(ToolchainError::NotFound {
        searched: searched.join("; "),
    })
}

fn has_cutlass(include: &Path) -> bool {
    include.join("cutlass").join("cutlass.h").is_file()
}

fn find_cutlass(env: EnvFn, cache: Option<&Path>) -> Result<PathBuf, ToolchainError> {
    if let Some(dir) = var(env, "CUTLASS_DIR") {
        let include = Path::new(&dir).join("include");
        return if has_cutlass(&include) {
            Ok(include)
        } else {
            Err(ToolchainError::BadToolkit {
                var: "CUTLASS_DIR",
                path: dir.into(),
                problem: format!("no cutlass/cutlass.h in {}", include.display()),
            })
        };
    }
    let mut searched = vec!["CUTLASS_DIR (unset)".to_string()];
    if let Some(cache) = cache {
        let include = cache_cutlass_include(cache);
        if has_cutlass(&include) {
            return Ok(include);
        }
        searched.push(include.display().to_string());
    }
    Err(ToolchainError::CutlassNotFound {
        searched: searched.join("; "),
    })
}

pub(crate) fn discover_with(env: EnvFn) -> Result<Toolchain, ToolchainError> {
    // No cache location (no HOME) is only an error when nothing else is found.
    let cache = cache_dir_with(env).ok();
    let (cuda, source) = find_cuda(env, cache.as_deref())?;
    let cutlass_include = find_cutlass(env, cache.as_deref())?;
    Ok(Toolchain {
        cuda_home: cuda.home,
        nvcc: cuda.nvcc,
        include_dirs: cuda.include_dirs,
        cutlass_include,
        lib_dir: cuda.lib_dir,
        source,
    })
}

/// The toolchain inside an installed cache directory, ignoring the environment.
pub(crate) fn from_cache(cache: &Path) -> Result<Toolchain, String> {
    let cuda = check_cuda_home(&cache_cuda_home(cache), None)?;
    let cutlass_include = cache_cutlass_include(cache);
    if !has_cutlass(&cutlass_include) {
        return Err(format!(
            "no cutlass/cutlass.h in {}",
            cutlass_include.display()
        ));
    }
    Ok(Toolchain {
        cuda_home: cuda.home,
        nvcc: cuda.nvcc,
        include_dirs: cuda.include_dirs,
        cutlass_include,
        lib_dir: cuda.lib_dir,
        source: Source::Cache,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{discover_in, fake_cache, fake_cuda, touch, TempDir};
    use std::collections::HashMap;

    #[test]
    fn cache_dir_precedence() {
        let env = |vars: &[(&str, &str)]| {
            let map: HashMap<String, OsString> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
            cache_dir_with(&move |key| map.get(key).cloned())
        };
        let leaf = "toolchain-13.0.88";
        assert_eq!(
            env(&[
                ("MSA_TOOLCHAIN_DIR", "/a"),
                ("XDG_CACHE_HOME", "/b"),
                ("HOME", "/c")
            ])
            .unwrap(),
            PathBuf::from("/a")
        );
        assert_eq!(
            env(&[("XDG_CACHE_HOME", "/b"), ("HOME", "/c")]).unwrap(),
            Path::new("/b/msa-rs").join(leaf)
        );
        assert_eq!(
            env(&[("MSA_TOOLCHAIN_DIR", ""), ("HOME", "/c")]).unwrap(),
            Path::new("/c/.cache/msa-rs").join(leaf)
        );
        assert!(matches!(env(&[]), Err(ToolchainError::NoCacheDir)));
    }

    #[test]
    fn precedence_cuda_home_nvcc_path_cache() {
        let t = TempDir::new();
        let (a, b, c, cache) = (
            t.0.join("a"),
            t.0.join("b"),
            t.0.join("c"),
            t.0.join("cache"),
        );
        fake_cuda(&a, "lib64");
        fake_cuda(&b, "lib64");
        fake_cuda(&c, "targets/x86_64-linux/lib");
        fake_cache(&cache);
        let nvcc_b = b.join("bin/nvcc");
        let path_c = c.join("bin");

        let all = [
            ("CUDA_HOME", a.as_path()),
            ("CUDA_PATH", b.as_path()),
            ("NVCC", nvcc_b.as_path()),
            ("PATH", path_c.as_path()),
            ("MSA_TOOLCHAIN_DIR", cache.as_path()),
        ];
        let tc = discover_in(&all).unwrap();
        assert_eq!(
            (tc.cuda_home.as_path(), tc.source),
            (a.as_path(), Source::Env("CUDA_HOME"))
        );
        assert_eq!(tc.lib_dir, a.join("lib64"));
        assert_eq!(
            tc.include_dirs,
            vec![a.join("include"), a.join("include/cccl")]
        );
        assert_eq!(tc.cutlass_include, cache_cutlass_include(&cache));

        let tc = discover_in(&all[1..]).unwrap();
        assert_eq!(
            (tc.cuda_home.as_path(), tc.source),
            (b.as_path(), Source::Env("CUDA_PATH"))
        );

        let tc = discover_in(&all[2..]).unwrap();
        assert_eq!(
            (tc.nvcc.as_path(), tc.source),
            (nvcc_b.as_path(), Source::Nvcc)
        );
        assert_eq!(tc.cuda_home, b);

        let tc = discover_in(&all[3..]).unwrap();
        assert_eq!(tc.source, Source::Path);
        assert_eq!(tc.cuda_home, c.canonicalize().unwrap());
        assert_eq!(tc.lib_dir, tc.cuda_home.join("targets/x86_64-linux/lib"));

        let tc = discover_in(&all[4..]).unwrap();
        assert_eq!(tc.source, Source::Cache);
        assert_eq!(tc, from_cache(&cache).unwrap());
    }

    #[test]
    fn cache_dir_from_xdg_and_home() {
        let t = TempDir::new();
        let xdg_cache = t.0.join("xdg/msa-rs/toolchain-13.0.88");
        let home_cache = t.0.join("home/.cache/msa-rs/toolchain-13.0.88");
        fake_cache(&xdg_cache);
        fake_cache(&home_cache);
        let (xdg, home) = (t.0.join("xdg"), t.0.join("home"));
        let tc = discover_in(&[("XDG_CACHE_HOME", &xdg), ("HOME", &home)]).unwrap();
        assert_eq!(tc.cuda_home, cache_cuda_home(&xdg_cache));
        let tc = discover_in(&[("HOME", &home)]).unwrap();
        assert_eq!(tc.cuda_home, cache_cuda_home(&home_cache));
    }

    #[test]
    fn explicit_variables_that_are_wrong_are_errors() {
        let t = TempDir::new();
        let cache = t.0.join("cache");
        fake_cache(&cache);
        let empty = t.0.join("empty");
        std::fs::create_dir_all(&empty).unwrap();

        let err = discover_in(&[("CUDA_HOME", &empty), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap_err();
        assert!(
            matches!(
                err,
                ToolchainError::BadToolkit {
                    var: "CUDA_HOME",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_missing());
        let msg = err.to_string();
        assert!(
            msg.contains("no nvcc") && msg.contains("cargo xtask build-kernels"),
            "{msg}"
        );

        let nvcc = empty.join("bin/nvcc");
        let err = discover_in(&[("NVCC", &nvcc), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap_err();
        assert!(
            matches!(err, ToolchainError::BadToolkit { var: "NVCC", .. }),
            "{err}"
        );

        let err =
            discover_in(&[("CUTLASS_DIR", &empty), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap_err();
        assert!(
            matches!(
                err,
                ToolchainError::BadToolkit {
                    var: "CUTLASS_DIR",
                    ..
                }
            ),
            "{err}"
        );

        let cutlass = t.0.join("cutlass");
        touch(&cutlass.join("include/cutlass/cutlass.h"));
        let tc = discover_in(&[("CUTLASS_DIR", &cutlass), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap();
        assert_eq!(tc.cutlass_include, cutlass.join("include"));
    }

    #[test]
    fn incomplete_nvcc_on_path_falls_through_to_cache() {
        let t = TempDir::new();
        let (bare, cache) = (t.0.join("bare"), t.0.join("cache"));
        fake_cuda(&bare, "lib64");
        std::fs::remove_file(bare.join("include/cuda_runtime.h")).unwrap();
        fake_cache(&cache);
        let path = bare.join("bin");
        let tc = discover_in(&[("PATH", &path), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap();
        assert_eq!(tc.source, Source::Cache);
    }

    #[test]
    fn nothing_found_names_what_to_do() {
        let t = TempDir::new();
        let cache = t.0.join("missing");
        let err = discover_in(&[("MSA_TOOLCHAIN_DIR", &cache)]).unwrap_err();
        assert!(err.is_missing());
        let msg = err.to_string();
        for needle in [
            "cargo xtask build-kernels",
            "CUDA_HOME",
            "NVCC",
            "CUTLASS_DIR",
        ] {
            assert!(msg.contains(needle), "{msg}");
        }

        // CUDA found but no CUTLASS anywhere.
        let cuda = t.0.join("cuda");
        fake_cuda(&cuda, "lib64");
        let err = discover_in(&[("CUDA_HOME", &cuda), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap_err();
        assert!(
            matches!(err, ToolchainError::CutlassNotFound { .. }),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn nvcc_version_and_pin_warning() {
        let t = TempDir::new();
        let cuda = t.0.join("cuda");
        fake_cuda(&cuda, "lib64");
        let cache = t.0.join("cache");
        fake_cache(&cache);
        let tc = discover_in(&[("CUDA_HOME", &cuda), ("MSA_TOOLCHAIN_DIR", &cache)]).unwrap();
        let say = |release: &str| {
            let script = format!(
                "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n\
                 echo 'Cuda compilation tools, release {release}'\n"
            );
            std::fs::write(&tc.nvcc, script).unwrap();
        };
        say("13.0, V13.0.88");
        assert_eq!(tc.nvcc_version().unwrap(), "13.0.88");
        assert_eq!(tc.version_warning(), None);
        say("13.1, V13.1.80");
        assert!(tc
            .version_warning()
            .unwrap()
            .contains("not the pinned CUDA 13.0"));
        say("garbage");
        assert!(tc.nvcc_version().is_err());
    }
}
