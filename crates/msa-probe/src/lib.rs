//! Device probe of msa-rs: memoized SM capability and count, the architecture gate, and typed
//! reasons why kernels cannot run. Never panics.
//!
//! With feature `cuda` the CUDA driver is loaded at run time (cudarc, dynamic loading), so
//! binaries build and start on hosts without one; without it every probe returns
//! [`ProbeError::NotBuilt`]. [`kernels_available`] is the gate every GPU entry point calls.

#[cfg(feature = "cuda")]
mod driver;

/// Why a device cannot run the msa-rs kernels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "msa-rs was built without CUDA support; rebuild with `--features msa` (nvcc + CUTLASS: \
         `cargo xtask build-kernels` installs them)"
    )]
    NotBuilt,
    #[error(
        "the CUDA driver library (libcuda.so.1) was not found; install the NVIDIA driver (CUDA \
         13.0 or newer, e.g. 580) or add its directory to LD_LIBRARY_PATH"
    )]
    DriverNotFound,
    #[error("CUDA driver call {call} failed: {message} ({code})")]
    Driver {
        call: &'static str,
        code: i32,
        message: String,
    },
    #[error("no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)")]
    NoDevice,
    #[error("CUDA device {ordinal} does not exist: {count} device(s) visible")]
    OrdinalOutOfRange { ordinal: usize, count: usize },
    #[error(
        "CUDA device {ordinal} has compute capability {}.{}, which this build does not serve \
         (it has {}); {advice}",
        found.0, found.1, describe_targets(built)
    )]
    UnsupportedArch {
        ordinal: usize,
        found: (u32, u32),
        built: Vec<String>,
        advice: String,
    },
    #[error(
        "the CUDA kernels are not built into this binary; rebuild with `--features msa` (nvcc + \
         CUTLASS: `cargo xtask build-kernels` installs them)"
    )]
    KernelsNotBuilt,
}

pub type Result<T, E = ProbeError> = std::result::Result<T, E>;

/// What [`kernels_available`] found: the device and the compiled target that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub capability: (u32, u32),
    pub sm_count: u32,
    pub max_shared_memory_per_block_optin: u32,
    /// The target that runs on this device, e.g. `sm_90a`, or `compute_80` (PTX, JIT-compiled
    /// by the driver on first load).
    pub served_by: String,
}

/// A compiled target: `sm_XY` (SASS), `sm_XYa` (arch-specific SASS), `sm_XYf` (family SASS),
/// `compute_XY` (PTX). `XY` is major then one minor digit (`sm_100a` is 10.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Sass {
        major: u32,
        minor: u32,
        suffix: Option<char>,
    },
    Ptx {
        major: u32,
        minor: u32,
    },
}

use Target::{Ptx, Sass};

fn parse_target(target: &str) -> Option<Target> {
    let (ptx, rest) = if let Some(rest) = target.strip_prefix("sm_") {
        (false, rest)
    } else {
        (true, target.strip_prefix("compute_")?)
    };
    let (digits, suffix) = match rest.char_indices().last()? {
        (i, c @ ('a' | 'f')) => (&rest[..i], Some(c)),
        _ => (rest, None),
    };
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    let (major, minor) = (major.parse().ok()?, minor.parse().ok()?);
    Some(if ptx {
        Ptx { major, minor }
    } else {
        Sass {
            major,
            minor,
            suffix,
        }
    })
}

fn serves(target: Target, (major, minor): (u32, u32)) -> bool {
    match target {
        // Arch-specific SASS (wgmma, setmaxnreg) runs on exactly that capability.
        Sass {
            major: m,
            minor: n,
            suffix: Some('a'),
        } => (major, minor) == (m, n),
        // Plain and family SASS run on the same major at an equal or later minor.
        Sass {
            major: m, minor: n, ..
        } => major == m && minor >= n,
        // PTX is JIT-compiled by the driver for any later device.
        Ptx { major: m, minor: n } => (major, minor) >= (m, n),
    }
}

fn describe_targets(built: &[String]) -> String {
    built
        .iter()
        .map(|t| match parse_target(t) {
            Some(Sass {
                major,
                minor,
                suffix: Some('a'),
            }) => format!("{t} for {major}.{minor}"),
            Some(Sass { major, minor, .. }) => format!("{t} for {major}.x >= {major}.{minor}"),
            Some(Ptx { major, minor }) => format!("{t} PTX for >= {major}.{minor}"),
            None => format!("{t} (unrecognized)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The compiled target that runs on a device of `capability`: SASS before PTX (no JIT), in the
/// order of `built`; `None` if nothing does. Pure: the rule table of [`require_arch`].
pub fn served_by<'a>(built: &[&'a str], capability: (u32, u32)) -> Option<&'a str> {
    let fits = |want_sass: bool| {
        built.iter().copied().find(|t| {
            parse_target(t)
                .is_some_and(|p| matches!(p, Sass { .. }) == want_sass && serves(p, capability))
        })
    };
    fits(true).or_else(|| fits(false))
}

/// The arch check of [`require_arch`] on a known capability.
pub fn check_arch(ordinal: usize, capability: (u32, u32), built: &[&str]) -> Result<()> {
    if built.is_empty() {
        return Err(ProbeError::KernelsNotBuilt);
    }
    if served_by(built, capability).is_some() {
        return Ok(());
    }
    let advice = if capability < (8, 0) {
        "msa-rs kernels need compute capability 8.0 or newer (Hopper 9.0 for the fast path); \
         use the CPU backend on this GPU"
    } else {
        "rebuild with the default architectures (`--features msa` builds sm_90a, sm_80 and \
         compute_80 PTX) or use the CPU backend"
    };
    Err(ProbeError::UnsupportedArch {
        ordinal,
        found: capability,
        built: built.iter().map(|t| t.to_string()).collect(),
        advice: advice.into(),
    })
}

/// Number of visible CUDA devices (0 is not an error here).
pub fn device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        driver::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(ProbeError::NotBuilt)
    }
}

/// Compute capability `(major, minor)` of device `ordinal`, read from the driver once per
/// ordinal (a capability cannot change; entry points check it on every call).
pub fn sm_capability(ordinal: usize) -> Result<(u32, u32)> {
    #[cfg(feature = "cuda")]
    {
        driver::sm_capability(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(ProbeError::NotBuilt)
    }
}

/// Streaming-multiprocessor count of device `ordinal` (sizes the backward CTA walk); read once.
pub fn sm_count(ordinal: usize) -> Result<u32> {
    #[cfg(feature = "cuda")]
    {
        driver::sm_count(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(ProbeError::NotBuilt)
    }
}

/// The driver's name of device `ordinal`, e.g. `NVIDIA H200`.
pub fn device_name(ordinal: usize) -> Result<String> {
    #[cfg(feature = "cuda")]
    {
        driver::device_name(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(ProbeError::NotBuilt)
    }
}

/// The CUDA version the driver supports, `(major, minor)` (e.g. `(13, 0)`).
pub fn driver_version() -> Result<(u32, u32)> {
    #[cfg(feature = "cuda")]
    {
        driver::driver_version()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(ProbeError::NotBuilt)
    }
}

/// Largest dynamic shared memory a block may opt into on device `ordinal`, in bytes.
pub fn max_shared_memory_per_block_optin(ordinal: usize) -> Result<u32> {
    #[cfg(feature = "cuda")]
    {
        driver::max_shared_memory_per_block_optin(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(ProbeError::NotBuilt)
    }
}

/// Rejects device `ordinal` unless one of the `built` targets (`msa_kernels::built_archs()`,
/// e.g. `["sm_90a", "sm_80", "compute_80"]`) runs on it: `sm_90a` SASS serves exactly 9.0,
/// `sm_80` SASS serves 8.x, `compute_80` PTX serves anything >= 8.0 by JIT. Empty `built`:
/// [`ProbeError::KernelsNotBuilt`] (after [`ProbeError::NotBuilt`] when the probe itself is
/// built without CUDA). Returns the capability.
pub fn require_arch(ordinal: usize, built: &[&str]) -> Result<(u32, u32)> {
    if cfg!(not(feature = "cuda")) {
        return Err(ProbeError::NotBuilt);
    }
    if built.is_empty() {
        return Err(ProbeError::KernelsNotBuilt);
    }
    let capability = sm_capability(ordinal)?;
    check_arch(ordinal, capability, built)?;
    Ok(capability)
}

/// The gate of every GPU entry point: why the kernels cannot run on device `ordinal`, or what
/// the device is.
pub fn kernels_available(ordinal: usize, built: &[&str]) -> Result<DeviceInfo> {
    let capability = require_arch(ordinal, built)?;
    let served_by = served_by(built, capability).unwrap_or_default().to_string();
    Ok(DeviceInfo {
        ordinal,
        name: device_name(ordinal)?,
        capability,
        sm_count: sm_count(ordinal)?,
        max_shared_memory_per_block_optin: max_shared_memory_per_block_optin(ordinal)?,
        served_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILT: &[&str] = &["sm_90a", "sm_80", "compute_80"];

    #[test]
    fn rule_table() {
        let cases: &[((u32, u32), Option<&str>)] = &[
            ((9, 0), Some("sm_90a")),
            ((8, 0), Some("sm_80")),
            ((8, 6), Some("sm_80")),
            ((8, 9), Some("sm_80")),
            ((9, 1), Some("compute_80")),
            ((10, 0), Some("compute_80")),
            ((10, 3), Some("compute_80")),
            ((12, 0), Some("compute_80")),
            ((7, 5), None),
            ((7, 0), None),
        ];
        for &(cap, want) in cases {
            assert_eq!(served_by(BUILT, cap), want, "{cap:?}");
            assert_eq!(check_arch(0, cap, BUILT).is_ok(), want.is_some(), "{cap:?}");
        }
        // Without the PTX, Blackwell and 9.x other than 9.0 are not served.
        let sass_only = &["sm_90a", "sm_80"];
        assert_eq!(served_by(sass_only, (10, 0)), None);
        assert_eq!(served_by(sass_only, (9, 1)), None);
        assert_eq!(served_by(&["sm_90"], (9, 0)), Some("sm_90"));
        assert_eq!(served_by(&["sm_100f"], (10, 3)), Some("sm_100f"));
        assert_eq!(served_by(&["sm_100a"], (10, 3)), None);
        assert_eq!(served_by(&["sm_100a"], (10, 0)), Some("sm_100a"));
        assert_eq!(served_by(&["compute_90a"], (9, 0)), Some("compute_90a"));
        assert_eq!(served_by(&["bogus", "sm_x0", "sm_8"], (8, 0)), None);
    }

    #[test]
    fn unsupported_arch_names_found_built_and_advice() {
        let err = check_arch(1, (7, 5), BUILT).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(
            err,
            ProbeError::UnsupportedArch {
                ordinal: 1,
                found: (7, 5),
                ..
            }
        ));
        for needle in [
            "7.5",
            "sm_90a for 9.0",
            "sm_80 for 8.x >= 8.0",
            "compute_80 PTX",
            "CPU backend",
        ] {
            assert!(msg.contains(needle), "{msg}");
        }
        let msg = check_arch(0, (8, 6), &["sm_90a"]).unwrap_err().to_string();
        assert!(
            msg.contains("rebuild with the default architectures"),
            "{msg}"
        );
    }

    #[test]
    fn empty_build_means_kernels_not_built() {
        assert_eq!(check_arch(0, (9, 0), &[]), Err(ProbeError::KernelsNotBuilt));
        let want = if cfg!(feature = "cuda") {
            ProbeError::KernelsNotBuilt
        } else {
            ProbeError::NotBuilt
        };
        assert_eq!(require_arch(0, &[]), Err(want.clone()));
        assert_eq!(kernels_available(0, &[]), Err(want));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_cuda_every_probe_says_not_built() {
        assert_eq!(device_count(), Err(ProbeError::NotBuilt));
        assert_eq!(sm_capability(0), Err(ProbeError::NotBuilt));
        assert_eq!(sm_count(0), Err(ProbeError::NotBuilt));
        assert_eq!(device_name(0), Err(ProbeError::NotBuilt));
        assert_eq!(
            max_shared_memory_per_block_optin(0),
            Err(ProbeError::NotBuilt)
        );
        assert_eq!(require_arch(0, BUILT), Err(ProbeError::NotBuilt));
        assert_eq!(kernels_available(0, BUILT), Err(ProbeError::NotBuilt));
        assert!(ProbeError::NotBuilt.to_string().contains("--features msa"));
    }
}
