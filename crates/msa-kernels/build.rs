//! With feature `msa`: compiles every `kernels/src/**/*.cu` with nvcc into `libmsa_kernels.a`
//! (static cudart). Without it: nothing, so the crate builds on hosts with no CUDA at all.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Caps parallel nvcc processes (CUTLASS translation units take GBs of memory each).
const JOBS_VAR: &str = "MSA_NVCC_JOBS";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_MSA").is_none() {
        return;
    }
    if let Err(message) = build() {
        eprintln!("error: msa-kernels (feature `msa`): {message}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("no CARGO_MANIFEST_DIR")?);
    let kernels = manifest.join("../../kernels");
    let kernels = kernels
        .canonicalize()
        .map_err(|e| format!("{}: {e}", kernels.display()))?;
    println!("cargo:rerun-if-changed={}", kernels.display());
    for var in msa_toolchain::ENV_VARS.iter().chain([&JOBS_VAR]) {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // Never installs: a build script must not download 300 MB behind the user's back.
    let tc = msa_toolchain::discover().map_err(|e| e.to_string())?;
    if let Some(warning) = tc.version_warning() {
        println!("cargo:warning={warning}");
    }
    if tc.source == msa_toolchain::Source::Path {
        println!("cargo:rerun-if-env-changed=PATH");
    }
    // cc takes nvcc from NVCC. Not `.compiler(nvcc)`: cc would then pass host-only flags
    // (-ffunction-sections, ...) to nvcc unwrapped.
    std::env::set_var("NVCC", &tc.nvcc);

    let sources = msa_toolchain::kernel_sources(&kernels.join("src")).map_err(|e| e.to_string())?;
    if sources.is_empty() {
        return Err(format!(
            "no .cu files under {}",
            kernels.join("src").display()
        ));
    }

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("no OUT_DIR")?);
    let base = || {
        let mut b = cc::Build::new();
        b.cuda(true)
            .cudart("static")
            // cc would add -G (device debug, unoptimized) in debug profiles.
            .debug(false)
            .opt_level(3)
            .include(kernels.join("include"))
            .include(kernels.join("src"))
            .out_dir(&out_dir);
        for flag in tc.nvcc_flags() {
            b.flag(flag);
        }
        for arch in msa_toolchain::ARCHS {
            b.flag(arch.gencode);
        }
        b
    };

    // One Build per file: cc compiles several CUDA files of one Build as relocatable device
    // code (--device-c) plus a device-link step, which costs link time and loses the
    // JIT-able compute_80 PTX. Whole-program objects need no device link.
    let jobs = std::env::var(JOBS_VAR)
        .or_else(|_| std::env::var("NUM_JOBS"))
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, sources.len());
    let next = AtomicUsize::new(0);
    let mut compiled: Vec<(usize, Result<Vec<PathBuf>, String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(src) = sources.get(i) else {
                            break done;
                        };
                        let result = base()
                            .file(src)
                            .try_compile_intermediates()
                            .map_err(|e| format!("{}: {e}", src.display()));
                        done.push((i, result));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    if compiled.len() != sources.len() {
        return Err("a compile worker panicked".into());
    }
    // Archive in source order, whatever order the workers finished in.
    compiled.sort_by_key(|(i, _)| *i);
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for (_, result) in compiled {
        match result {
            Ok(objs) => objects.extend(objs),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(format!(
            "nvcc failed (its output is above):\n{}",
            errors.join("\n")
        ));
    }

    let linker = base();
    let lib = linker
        .try_create_archive("msa_kernels", &objects)
        .map_err(|e| e.to_string())?;
    cc::try_emit_link_directives(&linker, &lib).map_err(|e| e.to_string())?;
    println!("cargo:rustc-link-search=native={}", tc.lib_dir.display());
    println!(
        "cargo:rustc-env=MSA_KERNEL_ARCHS={}",
        msa_toolchain::built_targets()
    );
    Ok(())
}
