//! `cargo xtask build-kernels [-j N]`: compile-only check of every kernel for every arch.

use std::path::PathBuf;
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
    time: Duration,
}

pub fn run(args: &[String]) -> Result<(), String> {
    let jobs = match args {
        [] => std::thread::available_parallelism().map_or(1, |n| n.get()),
        [flag, n] if flag == "-j" || flag == "--jobs" => n
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("`{flag}` takes a positive number, got `{n}`"))?,
        _ => return crate::no_more_args(args),
    };
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
    let flags = tc.nvcc_flags();
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
                let obj = tmp.0.join(format!("{i}.{}.o", job.arch.name));
                let start = Instant::now();
                let out = Command::new(&tc.nvcc)
                    .arg("-c")
                    .arg(&job.src)
                    .arg("-o")
                    .arg(&obj)
                    .args(&flags)
                    .arg(job.arch.gencode)
                    .arg("-I")
                    .arg(kernels.join("include"))
                    .arg("-I")
                    .arg(kernels.join("src"))
                    .output();
                let time = start.elapsed();
                let (ok, log) = match out {
                    Ok(o) => {
                        let mut log = String::from_utf8_lossy(&o.stdout).into_owned();
                        log.push_str(&String::from_utf8_lossy(&o.stderr));
                        (o.status.success(), log)
                    }
                    Err(e) => (false, format!("running {}: {e}", tc.nvcc.display())),
                };
                let _guard = print.lock().unwrap();
                let status = if ok { "ok  " } else { "FAIL" };
                println!(
                    "  {status} {name:<40} {:<8} {:>6.1} s",
                    job.arch.name,
                    time.as_secs_f64()
                );
                if !log.trim().is_empty() {
                    println!("{}", log.trim_end());
                }
                outcomes.lock().unwrap().push(Outcome { ok, time });
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let failed = outcomes.iter().filter(|o| !o.ok).count();
    let nvcc_time: Duration = outcomes.iter().map(|o| o.time).sum();
    let summary = format!(
        "{} of {} compiles ok, {:.1} s wall ({:.1} s in nvcc)",
        outcomes.len() - failed,
        work.len(),
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
        for args in [&["-j"][..], &["-j", "0"], &["-j", "x"], &["--frob"]] {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            assert!(super::run(&args).is_err(), "{args:?}");
        }
    }
}
