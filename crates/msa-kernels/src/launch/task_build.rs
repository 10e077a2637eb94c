//! Task-build family (`kernels/include/msa/task_build.h`): NeMo's four backward task-build
//! kernels, bit-exact with `msa_plan::backward::task_build`.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Fills `scratch` and `tables` with -1 and runs the four kernels on `stream`.
///
/// # Safety
/// Every pointer of `inputs` must be a device allocation of the size `task_build.h` gives it for
/// `shape`, the work items must stay inside those arrays (`msa_plan::build_backward_tasks`
/// checks them), `scratch`/`tables` must hold `scratch_words`/`table_words` i32 (`tables`
/// 16-byte aligned), all usable from the current context, and `stream` a stream of it.
pub unsafe fn tables(
    inputs: sys::MsaTaskBuildInputs,
    shape: sys::MsaTaskBuildShape,
    scratch: DevicePtr,
    scratch_words: usize,
    tables: DevicePtr,
    table_words: usize,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_task_build_tables", unsafe {
        sys::msa_task_build_tables(
            inputs,
            shape,
            scratch as *mut i32,
            scratch_words,
            tables as *mut i32,
            table_words,
            stream,
        )
    })
}
