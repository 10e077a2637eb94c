//! The environment block of a benchmark's JSON: what ran (GPU, SM count, driver, CUDA runtime)
//! and what was built (git commit, features), so that numbers are never read without it.

use serde::Serialize;

/// The build and the device of one benchmark; what cannot be read is `None` (JSON null).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Environment {
    pub msa_version: &'static str,
    /// `git rev-parse HEAD` at build time, or "unknown".
    pub git_commit: &'static str,
    /// Cargo features of this build that change what runs.
    pub features: Vec<&'static str>,
    pub gpu: Option<String>,
    pub sm_count: Option<u32>,
    /// `major.minor`.
    pub compute_capability: Option<String>,
    /// The NVIDIA kernel module's version (`/proc/driver/nvidia/version`), e.g. `580.65.06`.
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, e.g. `13.0`.
    pub driver_cuda_version: Option<String>,
    /// The CUDA runtime linked with the kernels (static), e.g. `13.0`.
    pub cuda_runtime_version: Option<String>,
}

impl Environment {
    /// This build alone, no device fields.
    pub fn build() -> Self {
        Self {
            msa_version: env!("CARGO_PKG_VERSION"),
            git_commit: env!("MSA_GIT_COMMIT"),
            features: if cfg!(feature = "msa") {
                vec!["msa"]
            } else {
                Vec::new()
            },
            gpu: None,
            sm_count: None,
            compute_capability: None,
            driver_version: None,
            driver_cuda_version: None,
            cuda_runtime_version: None,
        }
    }

    /// This build and device `ordinal` as the driver reports it.
    pub fn with_device(ordinal: usize) -> Self {
        let dotted = |(major, minor): (u32, u32)| format!("{major}.{minor}");
        Self {
            gpu: msa_probe::device_name(ordinal).ok(),
            sm_count: msa_probe::sm_count(ordinal).ok(),
            compute_capability: msa_probe::sm_capability(ordinal).ok().map(dotted),
            driver_version: nvidia_module_version(),
            driver_cuda_version: msa_probe::driver_version().ok().map(dotted),
            cuda_runtime_version: cuda_runtime_version().map(dotted),
            ..Self::build()
        }
    }

    /// The JSON line: `{"record": "environment", "environment": {...}}`.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({"record": "environment", "environment": self})
    }
}

/// `580.65.06` from `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ...`
/// (the open module's line reads `... Open Kernel Module for x86_64  580.65.06 ...`).
fn nvidia_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_module_version(&text)
}

fn parse_module_version(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let (_, rest) = line.split_once("Kernel Module")?;
    rest.split_whitespace()
        .find(|w| w.contains('.') && w.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
        .map(str::to_string)
}

#[cfg(feature = "msa")]
fn cuda_runtime_version() -> Option<(u32, u32)> {
    // The static CUDA runtime that msa-kernels links (cc's `cudart("static")`) defines it.
    extern "C" {
        fn cudaRuntimeGetVersion(version: *mut std::ffi::c_int) -> std::ffi::c_int;
    }
    let mut version = 0;
    // SAFETY: writes one int; needs no device or context.
    let code = unsafe { cudaRuntimeGetVersion(&mut version) };
    (code == 0 && version > 0).then_some((version as u32 / 1000, version as u32 % 1000 / 10))
}

#[cfg(not(feature = "msa"))]
fn cuda_runtime_version() -> Option<(u32, u32)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_block_names_commit_and_features() {
        let env = Environment::build();
        assert!(
            env.git_commit == "unknown"
                || (env.git_commit.len() == 40
                    && env.git_commit.bytes().all(|b| b.is_ascii_hexdigit())),
            "{}",
            env.git_commit
        );
        assert_eq!(env.features.contains(&"msa"), cfg!(feature = "msa"));
        let record = env.record();
        assert_eq!(record["record"], "environment");
        for key in [
            "gpu",
            "sm_count",
            "driver_version",
            "cuda_runtime_version",
            "git_commit",
            "features",
        ] {
            assert!(
                record["environment"].get(key).is_some(),
                "no {key} in {record}"
            );
        }
        assert_eq!(record["environment"]["gpu"], serde_json::Value::Null);
    }

    #[test]
    fn the_device_block_without_a_device_is_null_not_an_error() {
        let env = Environment::with_device(0);
        if msa_probe::device_count().unwrap_or(0) == 0 {
            assert_eq!((&env.gpu, env.sm_count), (&None, None));
        }
        // The runtime linked with the kernels answers without a driver.
        assert_eq!(env.cuda_runtime_version.is_some(), cfg!(feature = "msa"));
    }

    #[test]
    fn the_module_version_is_read_from_the_nvrm_line() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\nGCC version: gcc 12\n";
        assert_eq!(parse_module_version(text).as_deref(), Some("580.65.06"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:51:33 UTC 2025\n";
        assert_eq!(parse_module_version(open).as_deref(), Some("580.95.05"));
        assert_eq!(parse_module_version("garbage"), None);
    }
}
