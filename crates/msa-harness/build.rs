//! Embeds the git commit of the build (`MSA_GIT_COMMIT`, for the benchmark's environment
//! record): `git rev-parse HEAD`, or "unknown" outside a git checkout or without git.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MSA_GIT_COMMIT={commit}");
    // Rebuilt when HEAD moves: the checkout's HEAD (a worktree has its own), and the branch it
    // is on (a loose ref, or packed).
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        watched.push(Path::new(&dir).join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(Path::new(&common).join(branch));
        }
        watched.push(Path::new(&common).join("packed-refs"));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
