//! Real probing through the CUDA driver (cudarc, loaded at run time).

use crate::{ProbeError, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use once_cell::sync::{Lazy, OnceCell};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

fn driver_error(call: &'static str, e: DriverError) -> ProbeError {
    if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return ProbeError::NoDevice;
    }
    let name = e.error_name().map(|n| n.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    ProbeError::Driver {
        call,
        code: e.0 as i32,
        message: match (name, text) {
            (Ok(name), Ok(text)) => format!("{name}: {text}"),
            (Ok(name), Err(_)) => name,
            _ => format!("{:?}", e.0),
        },
    }
}

/// `cuInit` once. Checks for libcuda first: cudarc panics on its first call without it.
fn init() -> Result<()> {
    static INIT: OnceCell<Result<()>> = OnceCell::new();
    INIT.get_or_init(|| {
        // SAFETY: only attempts to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(ProbeError::DriverNotFound);
        }
        result::init().map_err(|e| driver_error("cuInit", e))
    })
    .clone()
}

pub(crate) fn device_count() -> Result<usize> {
    init()?;
    let count = result::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e))?;
    Ok(count.max(0) as usize)
}

fn device(ordinal: usize) -> Result<sys::CUdevice> {
    match device_count()? {
        0 => Err(ProbeError::NoDevice),
        count if ordinal >= count => Err(ProbeError::OrdinalOutOfRange { ordinal, count }),
        _ => result::device::get(ordinal as i32).map_err(|e| driver_error("cuDeviceGet", e)),
    }
}

fn attribute(ordinal: usize, attr: Attr) -> Result<u32> {
    let dev = device(ordinal)?;
    // SAFETY: dev comes from cuDeviceGet after cuInit.
    let value = unsafe { result::device::get_attribute(dev, attr) }
        .map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
    Ok(value.max(0) as u32)
}

type Memo<T> = Lazy<Mutex<HashMap<usize, T>>>;

/// Reads a per-device constant once; failures are not cached (the next call retries).
fn memo<T: Copy>(memo: &Memo<T>, ordinal: usize, read: impl FnOnce() -> Result<T>) -> Result<T> {
    if let Some(&v) = memo
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&ordinal)
    {
        return Ok(v);
    }
    let v = read()?;
    memo.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(ordinal, v);
    Ok(v)
}

pub(crate) fn sm_capability(ordinal: usize) -> Result<(u32, u32)> {
    static CAPABILITY: Memo<(u32, u32)> = Lazy::new(Default::default);
    memo(&CAPABILITY, ordinal, || {
        Ok((
            attribute(ordinal, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(ordinal, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    })
}

pub(crate) fn sm_count(ordinal: usize) -> Result<u32> {
    static SM_COUNT: Memo<u32> = Lazy::new(Default::default);
    memo(&SM_COUNT, ordinal, || {
        attribute(ordinal, Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    })
}

pub(crate) fn device_name(ordinal: usize) -> Result<String> {
    let dev = device(ordinal)?;
    result::device::get_name(dev).map_err(|e| driver_error("cuDeviceGetName", e))
}

pub(crate) fn driver_version() -> Result<(u32, u32)> {
    init()?;
    let mut version = 0;
    // SAFETY: writes one int; the driver is loaded and initialized.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| driver_error("cuDriverGetVersion", e))?;
    let version = version.max(0) as u32;
    Ok((version / 1000, version % 1000 / 10))
}

pub(crate) fn max_shared_memory_per_block_optin(ordinal: usize) -> Result<u32> {
    attribute(
        ordinal,
        Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    )
}

#[cfg(test)]
mod tests {
    use crate::*;

    const BUILT: &[&str] = &["sm_90a", "sm_80", "compute_80"];

    /// On a host without the driver (CI) every probe is `DriverNotFound`, with no panic; on a
    /// GPU host the probes agree with each other.
    #[test]
    fn probes_never_panic() {
        // SAFETY: only attempts to dlopen the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            assert_eq!(device_count(), Err(ProbeError::DriverNotFound));
            assert_eq!(sm_capability(0), Err(ProbeError::DriverNotFound));
            assert_eq!(sm_count(0), Err(ProbeError::DriverNotFound));
            assert_eq!(device_name(0), Err(ProbeError::DriverNotFound));
            assert_eq!(driver_version(), Err(ProbeError::DriverNotFound));
            assert_eq!(
                max_shared_memory_per_block_optin(0),
                Err(ProbeError::DriverNotFound)
            );
            assert_eq!(require_arch(0, BUILT), Err(ProbeError::DriverNotFound));
            assert_eq!(kernels_available(0, BUILT), Err(ProbeError::DriverNotFound));
            assert!(ProbeError::DriverNotFound.to_string().contains("libcuda"));
            return;
        }
        match device_count() {
            Ok(0) | Err(ProbeError::NoDevice) => {
                assert_eq!(kernels_available(0, BUILT), Err(ProbeError::NoDevice));
            }
            Ok(count) => {
                let cap = sm_capability(0).unwrap();
                assert_eq!(sm_capability(0), Ok(cap));
                assert!(sm_count(0).unwrap() > 0);
                assert_eq!(
                    sm_capability(count),
                    Err(ProbeError::OrdinalOutOfRange {
                        ordinal: count,
                        count
                    })
                );
                match kernels_available(0, BUILT) {
                    Ok(info) => assert_eq!(info.capability, cap),
                    Err(e) => assert!(matches!(e, ProbeError::UnsupportedArch { .. }), "{e}"),
                }
            }
            Err(e) => assert!(matches!(e, ProbeError::Driver { .. }), "{e}"),
        }
    }
}
