//! `cargo xtask <command>`: developer tasks of msa-rs that need more than cargo.

mod bindings;
mod build_kernels;
mod gpu_bundle;
mod wheel;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const HELP: &str = "\
usage: cargo xtask <command> [options]

commands:
  build-kernels [-j N] [--force]
                         find or install the pinned nvcc + CUTLASS toolchain, then compile
                         every kernels/src/**/*.cu once per architecture (compile only) and
                         report each compile's time; fails if any compile fails. Objects are
                         cached by the hash of source, headers, compiler and flags (the cache
                         build.rs uses): unchanged ones are reported as cached; --force
                         compiles everything
  bindings [--check]     regenerate crates/msa-kernels/src/sys.rs from
                         kernels/include/msa_kernels.h (bindgen + rustfmt); with --check,
                         fail if the committed file is stale instead
  gpu-bundle [--out DIR] build (release, --features msa) the `msa` CLI and the GPU test suite,
                         strip them and package them with run.sh into DIR (default
                         .gpu-bundle/); fails above 64 MiB
  wheel [--out DIR]      build the msa-torch wheel (maturin build --release of
                         crates/msa-torch, installing the pinned maturin into the per-user
                         cache if missing; $MATURIN overrides) into DIR (default
                         target/wheels/) and print its path and size
  help                   this text

environment: CUDA_HOME / CUDA_PATH / NVCC, CUTLASS_DIR, MSA_TOOLCHAIN_DIR (toolchain cache),
MSA_PTXAS_VERBOSE=1 (ptxas register report), MSA_NVCC_JOBS (parallel nvcc in build.rs),
MSA_KERNELS_BUILD_DIR (object cache; default target/msa-kernels-cache), MATURIN (wheel)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprintln!("{HELP}");
        return ExitCode::from(2);
    };
    let result = match command.as_str() {
        "help" | "-h" | "--help" => {
            println!("{HELP}");
            Ok(())
        }
        "build-kernels" => build_kernels::run(rest),
        "bindings" => bindings::run(rest),
        "gpu-bundle" => gpu_bundle::run(rest),
        "wheel" => wheel::run(rest),
        other => Err(format!("unknown command `{other}`; see `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask {command}: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask sits directly under it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// Rejects arguments a command does not take, so a typo never passes as success.
fn no_more_args(rest: &[String]) -> Result<(), String> {
    match rest.first() {
        None => Ok(()),
        Some(arg) => Err(format!(
            "unexpected argument `{arg}`; see `cargo xtask help`"
        )),
    }
}

/// The toolchain build.rs will find, installing the pinned one first when none exists.
fn ensure_toolchain(task: &str) -> Result<msa_toolchain::Toolchain, String> {
    match msa_toolchain::discover() {
        Ok(tc) => Ok(tc),
        Err(e) if e.is_missing() => {
            println!("{task}: no toolchain configured; installing the pinned one");
            msa_toolchain::install_pinned(&mut |m| println!("{task}: {m}"))
                .map_err(|e| e.to_string())?;
            // Rediscover: CUDA_HOME etc. still take precedence over the cache.
            msa_toolchain::discover().map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}
