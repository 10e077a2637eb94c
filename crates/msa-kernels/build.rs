//! With feature `msa`: compiles every `kernels/src/**/*.cu` with nvcc into `libmsa_kernels.a`
//! (static cudart), through the content-addressed object cache of `msa_toolchain::cache`
//! (`$MSA_KERNELS_BUILD_DIR`, default `target/msa-kernels-cache`): only translation units whose
//! source, local headers, compiler or flags changed are compiled; each one compiled is reported
//! as a `cargo:warning`, the count reused goes to stderr. Without `msa`: nothing, so the crate
//! builds on hosts with no CUDA at all.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
    let cache_vars = [msa_toolchain::cache::BUILD_DIR_VAR]
        .into_iter()
        .chain(msa_toolchain::cache::NVCC_ENV_VARS.iter().copied());
    for var in msa_toolchain::ENV_VARS
        .iter()
        .copied()
        .chain([JOBS_VAR])
        .chain(cache_vars)
    {
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

    // Objects live in the content-addressed cache (msa_toolchain::cache): a translation unit
    // whose source, local headers, compiler and flags are unchanged is reused, whichever
    // profile or command (clippy, test, build) compiled it first.
    let cache_dir = msa_toolchain::cache::build_dir(
        &msa_toolchain::cache::target_dir_of_out_dir(&out_dir).unwrap_or_else(|| out_dir.clone()),
    );
    let tool = base().try_get_compiler().map_err(|e| e.to_string())?;
    let fingerprint = msa_toolchain::cache::compiler_fingerprint(tool.path(), tool.args());
    let include_dirs = [kernels.join("include"), kernels.join("src")];
    let mut todo = Vec::new();
    let mut objects = Vec::new();
    for (i, src) in sources.iter().enumerate() {
        let key = msa_toolchain::cache::object_key(&fingerprint, src, &include_dirs)
            .map_err(|e| e.to_string())?;
        let stem = src
            .strip_prefix(kernels.join("src"))
            .unwrap_or(src)
            .with_extension("")
            .to_string_lossy()
            .replace(['/', '\\'], "_");
        let cached = cache_dir.join(format!("{stem}-{key}.o"));
        if !cached.is_file() {
            todo.push(i);
        }
        objects.push(cached);
    }
    eprintln!(
        "msa-kernels: {} of {} kernel objects reused from {}",
        sources.len() - todo.len(),
        sources.len(),
        cache_dir.display()
    );

    // One Build per file: cc compiles several CUDA files of one Build as relocatable device
    // code (--device-c) plus a device-link step, which costs link time and loses the
    // JIT-able compute_80 PTX. Whole-program objects need no device link.
    let jobs = std::env::var(JOBS_VAR)
        .or_else(|_| std::env::var("NUM_JOBS"))
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, todo.len().max(1));
    let next = AtomicUsize::new(0);
    let errors: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                s.spawn(|| {
                    let mut errors = Vec::new();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&i) = todo.get(n) else {
                            break errors;
                        };
                        if let Err(e) =
                            compile_into_cache(&base, &sources[i], &out_dir, i, &objects[i])
                        {
                            errors.push(e);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|_| vec!["a compile worker panicked".into()])
            })
            .collect()
    });
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

/// Compiles source `i` into a job directory of its own, then moves the object into the cache as
/// `cached`, and says so (`cargo:warning`, so a rebuild shows what it compiled).
fn compile_into_cache(
    base: &dyn Fn() -> cc::Build,
    src: &Path,
    out_dir: &Path,
    i: usize,
    cached: &Path,
) -> Result<(), String> {
    let start = Instant::now();
    let objs = base()
        .out_dir(out_dir.join(format!("job-{i}")))
        .file(src)
        .try_compile_intermediates()
        .map_err(|e| format!("{}: {e}", src.display()))?;
    let [obj] = objs.as_slice() else {
        return Err(format!(
            "{}: expected one object, got {objs:?}",
            src.display()
        ));
    };
    msa_toolchain::cache::store(obj, cached).map_err(|e| e.to_string())?;
    let shown = src.to_string_lossy();
    let shown = shown
        .find("kernels/src/")
        .map_or(&*shown, |at| &shown[at..]);
    println!(
        "cargo:warning=compiled {shown} ({:.1} s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
