//! `cargo xtask build-kernels [-j N] [--force]`: compile-only check of every kernel for every
//! arch. Objects go to the content-addressed cache of `msa_toolchain::cache` (the one build.rs
//! uses), so a translation unit whose source, headers, compiler and flags are unchanged is
//! reported as cached instead of compiled again; `--force` compiles everything.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Job<'a> {
    src: PathBuf,
    arch: &'a msa_toolchain::Arch,
}

struct Outcome {
    ok: bool,
    cached: bool,
    time: Duration,
}

struct Options {
    jobs: usize,
    force: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        force: false,
    };
    let mut rest = args;
    loop {
        match rest {
            [] => return Ok(opts),
            [flag, tail @ ..] if flag == "--force" => {
                opts.force = true;
                rest = tail;
            }
            [flag, n, tail @ ..] if flag == "-j" || flag == "--jobs" => {
                opts.jobs = n
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("`{flag}` takes a positive number, got `{n}`"))?;
                rest = tail;
            }
            _ => return crate::no_more_args(rest).map(|()| opts),
        }
    }
}

/// The cargo target directory xtask and build.rs share: `CARGO_TARGET_DIR`, else `target/`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let Options { jobs, force } = parse(args)?;
    let total = Instant::now();
    let tc = crate::ensure_toolchain("build-kernels")?;
    let version = tc.nvcc_version().map_err(|e| e.to_string())?;
    println!(
        "build-kernels: nvcc {version} at {} (from {}), CUTLASS {}",
        tc.nvcc.display(),
        tc.source,
        tc.cutlass_include.display()
    );

    if let Some(warning) = tc.version_warning() {
        println!("build-kernels: warning: {warning}");
    }
    let root = crate::repo_root();
    let kernels = root.join("kernels");
    let kernels = kernels
        .canonicalize()
        .map_err(|e| format!("{}: {e}", kernels.display()))?;
    let sources = msa_toolchain::kernel_sources(&kernels.join("src")).map_err(|e| e.to_string())?;
    if sources.is_empty() {
        return Err(format!(
            "no .cu files under {}",
            kernels.join("src").display()
        ));
    }
    let work: Vec<Job> = sources
        .iter()
        .flat_map(|src| {
            msa_toolchain::ARCHS.iter().map(|arch| Job {
                src: src.clone(),
                arch,
            })
        })
        .collect();
    let jobs = jobs.min(work.len());
    println!(
        "build-kernels: {} files x {} archs, {jobs} at a time",
        sources.len(),
        msa_toolchain::ARCHS.len()
    );

    let tmp = TempDir::new()?;
    let cache_dir = msa_toolchain::cache::build_dir(&target_dir(&root));
    let include_dirs = [kernels.join("include"), kernels.join("src")];
    // Everything but the input and output files: the compiler identity of each arch.
    let arch_args = |arch: &msa_toolchain::Arch| {
        let mut args = tc.nvcc_flags();
        args.push(arch.gencode.into());
        for dir in &include_dirs {
            args.push("-I".into());
            args.push(dir.into());
        }
        args
    };
    let fingerprints: Vec<String> = msa_toolchain::ARCHS
        .iter()
        .map(|arch| msa_toolchain::cache::compiler_fingerprint(&tc.nvcc, &arch_args(arch)))
        .collect();
    println!(
        "build-kernels: object cache {}{}",
        cache_dir.display(),
        if force {
            " (--force: compiling everything)"
        } else {
            ""
        }
    );
    let next = AtomicUsize::new(0);
    let outcomes = Mutex::new(Vec::new());
    let print = Mutex::new(());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = work.get(i) else { break };
                let name = job
                    .src
                    .strip_prefix(&root)
                    .unwrap_or(&job.src)
                    .display()
                    .to_string();
                let arch_index = msa_toolchain::ARCHS
                    .iter()
                    .position(|a| a == job.arch)
                    .expect("job arch is one of ARCHS");
                let stem = job
                    .src
                    .strip_prefix(kernels.join("src"))
                    .unwrap_or(&job.src)
                    .with_extension("")
                    .to_string_lossy()
                    .replace(['/', '\\'], "_");
                let start = Instant::now();
                let cached = msa_toolchain::cache::object_key(
                    &fingerprints[arch_index],
                    &job.src,
                    &include_dirs,
                )
                .map(|key| cache_dir.join(format!("{stem}.{}-{key}.o", job.arch.name)));
                let (ok, hit, log) = match cached {
                    Err(e) => (false, false, e.to_string()),
                    Ok(cached) if cached.is_file() && !force => (true, true, String::new()),
                    Ok(cached) => {
                        let obj = tmp.0.join(format!("{i}.{}.o", job.arch.name));
                        let out = Command::new(&tc.nvcc)
                            .arg("-c")
                            .arg(&job.src)
                            .arg("-o")
                            .arg(&obj)
                            .args(arch_args(job.arch))
                            .output();
                        match out {
                            Ok(o) => {
                                let mut log = String::from_utf8_lossy(&o.stdout).into_owned();
                                log.push_str(&String::from_utf8_lossy(&o.stderr));
                                let stored = if o.status.success() {
                                    msa_toolchain::cache::store(&obj, &cached)
                                        .map_err(|e| e.to_string())
                                } else {
                                    Ok(())
                                };
                                if let Err(e) = &stored {
                                    log.push_str(e);
                                }
                                (o.status.success() && stored.is_ok(), false, log)
                            }
                            Err(e) => (false, false, format!("running {}: {e}", tc.nvcc.display())),
                        }
                    }
                };
                let time = start.elapsed();
                let _guard = print.lock().unwrap();
                let status = if ok { "ok  " } else { "FAIL" };
                let took = if hit {
                    "cached".to_string()
                } else {
                    format!("{:.1} s", time.as_secs_f64())
                };
                println!("  {status} {name:<48} {:<8} {took:>8}", job.arch.name);
                if !log.trim().is_empty() {
                    println!("{}", log.trim_end());
                }
                outcomes.lock().unwrap().push(Outcome {
                    ok,
                    cached: hit,
                    time,
                });
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let failed = outcomes.iter().filter(|o| !o.ok).count();
    let nvcc_time: Duration = outcomes.iter().filter(|o| !o.cached).map(|o| o.time).sum();
    let cached = outcomes.iter().filter(|o| o.cached).count();
    let summary = format!(
        "{} of {} compiles ok ({} compiled, {cached} cached), {:.1} s wall ({:.1} s in nvcc)",
        outcomes.len() - failed,
        work.len(),
        outcomes.len() - cached,
        total.elapsed().as_secs_f64(),
        nvcc_time.as_secs_f64()
    );
    if failed > 0 {
        return Err(format!("{failed} compiles failed; {summary}"));
    }
    println!("build-kernels: {summary}");
    Ok(())
}

/// Scratch directory for the objects, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, String> {
        let dir = std::env::temp_dir().join(format!("msa-build-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rejects_bad_arguments_before_doing_anything() {
        for args in [
            &["-j"][..],
            &["-j", "0"],
            &["-j", "x"],
            &["--frob"],
            &["--force", "-j"],
        ] {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            assert!(super::run(&args).is_err(), "{args:?}");
        }
    }
}
