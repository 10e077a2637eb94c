//! Making NCCL loadable for `msa run --cp N` over NCCL. cudarc loads the library by name at
//! run time (`libnccl.so`, `libnccl.so.13`, `libnccl.so.12`, …) and never tries `libnccl.so.2`,
//! the only name pip's `nvidia-nccl-cu*` wheels (PyTorch's NCCL) ship. When no candidate loads
//! and `MSA_NCCL_LIB` names the library, it is linked as `libnccl.so` in a private directory
//! and this command runs again with that directory first on `LD_LIBRARY_PATH` (the dynamic
//! loader reads the variable only when a process starts).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use msa_harness::cp::nccl::nccl_loadable;
use msa_harness::{HarnessError, Result};

/// The variable naming the NCCL library file.
const LIB_VAR: &str = "MSA_NCCL_LIB";
/// Set in the re-run: the library it was given, so that a second failure is an error.
const RERUN_VAR: &str = "MSA_NCCL_RERUN";

fn err(reason: String) -> HarnessError {
    HarnessError::Cp(reason)
}

/// Returns when NCCL loads; otherwise re-runs this process with `MSA_NCCL_LIB` on the loader's
/// path (never returns then) or says why it cannot.
pub fn ensure_loadable() -> Result<()> {
    if nccl_loadable() {
        return Ok(());
    }
    if let Some(lib) = std::env::var_os(RERUN_VAR) {
        return Err(err(format!(
            "NCCL does not load even with {} linked as libnccl.so on LD_LIBRARY_PATH (is it \
             an NCCL 2 library for this machine?)",
            Path::new(&lib).display()
        )));
    }
    let Some(lib) = std::env::var_os(LIB_VAR).map(PathBuf::from) else {
        return Err(err(format!(
            "NCCL is not loadable under the names cudarc tries (libnccl.so, libnccl.so.13, \
             libnccl.so.12, …); set {LIB_VAR} to the library, e.g. PyTorch's: {LIB_VAR}=$(python3 \
             -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], \"lib\", \
             \"libnccl.so.2\"))')"
        )));
    };
    let lib = lib.canonicalize().map_err(|e| {
        err(format!(
            "{LIB_VAR}={}: {e} (it must name the NCCL library file, e.g. .../nvidia/nccl/lib/libnccl.so.2)",
            lib.display()
        ))
    })?;
    if !lib.is_file() {
        return Err(err(format!("{LIB_VAR}={} is not a file", lib.display())));
    }
    let dir = std::env::temp_dir().join(format!("msa-nccl-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    let linked = std::fs::create_dir_all(&dir)
        .and_then(|()| match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .and_then(|()| std::os::unix::fs::symlink(&lib, &link));
    linked.map_err(|e| {
        err(format!(
            "linking {} as {}: {e}",
            lib.display(),
            link.display()
        ))
    })?;
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let exe = std::env::current_exe().map_err(|e| err(format!("finding this program: {e}")))?;
    eprintln!(
        "NCCL: {} (as {}), running again",
        lib.display(),
        link.display()
    );
    let e = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(RERUN_VAR, &lib)
        .exec();
    Err(err(format!("running {} again: {e}", exe.display())))
}
