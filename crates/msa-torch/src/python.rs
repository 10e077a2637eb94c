//! The extension module `msa_torch._C` (feature `python`): [`crate::calls`] for Python, with the
//! GIL released around every enqueue and [`MsaError`] turned into Python exceptions
//! ([`crate::error_kind`]): `ValueError` for arguments, `msa_torch._C.TopKError` (a `ValueError`
//! with `code`, `reason`, `head`, `query`, `slot`) for an invalid selection, `RuntimeError` for
//! CUDA errors. Tensors arrive as `(data_ptr, numel)` tuples, streams as integers.

use msa::raw::CallShape;
use msa::MsaError;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::calls::{self, View};
use crate::{error_kind, ErrorKind};

create_exception!(
    _C,
    TopKError,
    PyValueError,
    "An invalid top-k entry found by prepare's validation: `code` (1 negative, 2 out of range, \
     3 non-causal, 4 duplicate), `reason`, and the entry `topk_indices[head, query, slot]`."
);

/// The short reason of a fault code (the message has the long one).
fn fault_reason(code: msa::TopkFaultCode) -> &'static str {
    match code {
        msa::TopkFaultCode::Negative => "negative",
        msa::TopkFaultCode::OutOfRange => "out_of_range",
        msa::TopkFaultCode::NonCausal => "non_causal",
        msa::TopkFaultCode::Duplicate => "duplicate",
    }
}

fn to_py(py: Python<'_>, e: MsaError) -> PyErr {
    let message = e.to_string();
    match error_kind(&e) {
        ErrorKind::Argument => PyValueError::new_err(message),
        ErrorKind::Cuda => PyRuntimeError::new_err(message),
        ErrorKind::TopK => {
            let err = TopKError::new_err(message);
            let value = err.value(py);
            // `(code, head, query, slot)` of the device word; the planner's host check (never
            // reached from here) has no code.
            let fields = match &e {
                MsaError::TopK(f) => Some((Some(f.code.code()), f.head, f.query, f.slot)),
                MsaError::Plan(msa_plan::PlanError::TopK {
                    head, query, slot, ..
                }) => Some((None, *head, *query, *slot)),
                _ => None,
            };
            if let Some((code, head, query, slot)) = fields {
                let reason = match &e {
                    MsaError::TopK(f) => fault_reason(f.code).to_string(),
                    MsaError::Plan(msa_plan::PlanError::TopK { reason, .. }) => reason.clone(),
                    _ => String::new(),
                };
                // Setting attributes on a fresh exception instance cannot fail in practice; the
                // message carries the same facts if it ever did.
                let _ = value.setattr("code", code);
                let _ = value.setattr("head", head);
                let _ = value.setattr("query", query);
                let _ = value.setattr("slot", slot);
                let _ = value.setattr("reason", reason);
            }
            err
        }
    }
}

/// The validated integers of one call and every size they imply (`msa::raw::CallShape`).
#[pyclass(frozen, name = "CallShape", module = "msa_torch._C")]
struct PyCallShape {
    inner: CallShape,
}

#[pymethods]
impl PyCallShape {
    /// `CallShape(total_q, total_k, batch, total_rows, max_seqlen_k, has_fragments, sm_count)`;
    /// `ValueError` for integers no layout can have.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        total_q: usize,
        total_k: usize,
        batch: usize,
        total_rows: usize,
        max_seqlen_k: usize,
        has_fragments: bool,
        sm_count: usize,
    ) -> PyResult<Self> {
        CallShape::new(
            total_q,
            total_k,
            batch,
            total_rows,
            max_seqlen_k,
            has_fragments,
            sm_count,
        )
        .map(|inner| Self { inner })
        .map_err(|e| to_py(py, e.into()))
    }

    /// Every size by name (`msa_torch_sizes` in calls.rs): element counts and workspace bytes.
    fn sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, v) in calls::size_entries(&self.inner) {
            d.set_item(name, v)?;
        }
        Ok(d)
    }

    /// Bytes of the forward workspace with the kernel set `kernels` (`"sm90a"`, `"sm80"`).
    fn forward_workspace_bytes(&self, py: Python<'_>, kernels: &str) -> PyResult<usize> {
        let k = calls::kernel_set(kernels).map_err(|e| to_py(py, e))?;
        Ok(self.inner.sizes().forward_workspace_bytes(k))
    }

    /// Bytes of the backward workspace on `path` (`"sm90"`, `"sm80_atomic"`,
    /// `"deterministic"`).
    fn backward_workspace_bytes(&self, py: Python<'_>, path: &str) -> PyResult<usize> {
        let p = calls::backward_path(path).map_err(|e| to_py(py, e))?;
        Ok(self.inner.sizes().backward_workspace_bytes(p))
    }

    /// Bytes of prepare's scratch (host arithmetic).
    fn prepare_workspace_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        calls::prepare_workspace_bytes(&self.inner).map_err(|e| to_py(py, e))
    }

    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "CallShape(total_q={}, total_k={}, batch={}, total_rows={}, max_seqlen_k={}, \
             has_fragments={}, sm_count={})",
            s.total_q(),
            s.total_k(),
            s.batch(),
            s.total_rows(),
            s.max_seqlen_k(),
            if s.has_fragments() { "True" } else { "False" },
            s.sm_count()
        )
    }
}

/// `sizes(total_q, total_k, batch, total_rows, max_seqlen_k, has_fragments, sm_count) -> dict`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn sizes<'py>(
    py: Python<'py>,
    total_q: usize,
    total_k: usize,
    batch: usize,
    total_rows: usize,
    max_seqlen_k: usize,
    has_fragments: bool,
    sm_count: usize,
) -> PyResult<Bound<'py, PyDict>> {
    PyCallShape::new(
        py,
        total_q,
        total_k,
        batch,
        total_rows,
        max_seqlen_k,
        has_fragments,
        sm_count,
    )?
    .sizes(py)
}

/// The targets compiled into this extension, e.g. `["sm_90a", "sm_80", "compute_80"]`.
#[pyfunction]
fn built_archs() -> Vec<&'static str> {
    msa_kernels::built_archs().to_vec()
}

/// The compiled target that runs on a device of compute capability `major.minor` (SASS before
/// PTX), or `None`.
#[pyfunction]
fn served_by(major: u32, minor: u32) -> Option<&'static str> {
    msa_probe::served_by(msa_kernels::built_archs(), (major, minor))
}

/// `None` when this build serves device `ordinal` of compute capability `major.minor`, else the
/// probe's message naming what was found, what was built and what to do.
#[pyfunction]
fn unsupported_reason(ordinal: usize, major: u32, minor: u32) -> Option<String> {
    msa_probe::check_arch(ordinal, (major, minor), msa_kernels::built_archs())
        .err()
        .map(|e| e.to_string())
}

/// The kernel set a device of compute capability `major.minor` runs: `"sm90a"` on 9.0, else
/// `"sm80"`.
#[pyfunction]
fn kernel_set(major: u32, minor: u32) -> &'static str {
    calls::kernel_set_name(msa::raw::KernelSet::for_capability(major, minor))
}

/// MSA's backward path: `"deterministic"` when asked, else `"sm90"` with the sm_90a kernels and
/// `"sm80_atomic"` with the sm_80 ones.
#[pyfunction]
fn backward_path(py: Python<'_>, deterministic: bool, kernels: &str) -> PyResult<&'static str> {
    let k = calls::kernel_set(kernels).map_err(|e| to_py(py, e))?;
    Ok(calls::backward_path_name(msa::raw::BackwardPath::select(
        deterministic,
        k,
    )))
}

/// The kernel set of the current device as the launchers see it (`cudaDeviceGetAttribute`, read
/// once per device and cached): `"sm90a"` or `"sm80"`. Needs the device current.
#[pyfunction]
fn device_kernels(py: Python<'_>) -> PyResult<&'static str> {
    msa::raw::device_kernels()
        .map(calls::kernel_set_name)
        .map_err(|e| to_py(py, e))
}

fn run(py: Python<'_>, f: impl FnOnce() -> msa::Result<()> + Send) -> PyResult<()> {
    py.detach(f).map_err(|e| to_py(py, e))
}

/// `build_layout(shape, cu_seqlens_q, cu_seqlens_k, fragment_indices | None, out[4], stream)`.
#[pyfunction]
fn build_layout(
    py: Python<'_>,
    shape: &PyCallShape,
    cu_seqlens_q: View,
    cu_seqlens_k: View,
    fragment_indices: Option<View>,
    out: [View; 4],
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: the Python caller passes live torch tensors of the current device (data_ptr,
    // numel) that it keeps alive until the stream has run the launch, and that device's current
    // stream; the cu_seqlens are MSA's contract (the kernels trust them, as MSA's).
    run(py, || unsafe {
        calls::build_layout(s, cu_seqlens_q, cu_seqlens_k, fragment_indices, out, stream)
    })
}

/// `prepare(shape, layout[6], topk, out[12], workspace, stream)`: unchecked, never synchronizes.
#[pyfunction]
fn prepare(
    py: Python<'_>,
    shape: &PyCallShape,
    layout: Vec<View>,
    topk: View,
    out: Vec<View>,
    workspace: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `build_layout`; `layout` is build_layout's output for `shape`.
    run(py, || unsafe {
        calls::prepare(s, &layout, topk, &out, workspace, stream)
    })
}

/// `validate_prepare(shape, error_word, stream)`: synchronizes `stream`, reads prepare's error
/// word and raises `TopKError` for an invalid selection.
#[pyfunction]
fn validate_prepare(
    py: Python<'_>,
    shape: &PyCallShape,
    error_word: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `build_layout`; the Python caller never calls it while capturing.
    run(py, || unsafe {
        calls::validate_prepare(s, error_word, stream)
    })
}

/// `forward(shape, layout[6], meta[13], (q, k, v), (out, lse), kernels, workspace, stream)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn forward(
    py: Python<'_>,
    shape: &PyCallShape,
    layout: Vec<View>,
    meta: Vec<View>,
    qkv: [View; 3],
    out: [View; 2],
    kernels: &str,
    workspace: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `build_layout`; `meta` is prepare's output for `layout` (validated or trusted
    // by the caller, as MSA's unchecked metadata).
    run(py, || unsafe {
        calls::forward(s, &layout, &meta, qkv, out, kernels, workspace, stream)
    })
}

/// `backward(shape, layout[6], meta[13], (q, k, v), (dout, out, lse), (dq, dk, dv), path,
/// workspace, stream)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn backward(
    py: Python<'_>,
    shape: &PyCallShape,
    layout: Vec<View>,
    meta: Vec<View>,
    qkv: [View; 3],
    inputs: [View; 3],
    grads: [View; 3],
    path: &str,
    workspace: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `forward`.
    run(py, || unsafe {
        calls::backward(
            s, &layout, &meta, qkv, inputs, grads, path, workspace, stream,
        )
    })
}

/// `indexer_forward(shape, layout[6], (qi, ki), (topk, lse), workspace, stream)`.
#[pyfunction]
fn indexer_forward(
    py: Python<'_>,
    shape: &PyCallShape,
    layout: Vec<View>,
    index: [View; 2],
    out: [View; 2],
    workspace: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `build_layout`.
    run(py, || unsafe {
        calls::indexer_forward(s, &layout, index, out, workspace, stream)
    })
}

/// `selection_lse(shape, layout[6], topk, (qi, ki), lse, stream)`.
#[pyfunction]
fn selection_lse(
    py: Python<'_>,
    shape: &PyCallShape,
    layout: Vec<View>,
    topk: View,
    index: [View; 2],
    lse: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `build_layout`.
    run(py, || unsafe {
        calls::selection_lse(s, &layout, topk, index, lse, stream)
    })
}

/// `kl_backward(shape, layout[6], meta[13], (q, k, teacher_lse, qi, ki, indexer_lse),
/// loss_coeff, (dqi, dki), workspace, stream)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn kl_backward(
    py: Python<'_>,
    shape: &PyCallShape,
    layout: Vec<View>,
    meta: Vec<View>,
    inputs: [View; 6],
    loss_coeff: f32,
    grads: [View; 2],
    workspace: View,
    stream: usize,
) -> PyResult<()> {
    let s = &shape.inner;
    // SAFETY: as `forward`.
    run(py, || unsafe {
        calls::kl_backward(
            s, &layout, &meta, inputs, loss_coeff, grads, workspace, stream,
        )
    })
}

// NeMo's backward-schedule helpers (`msa_torch.nemo`): the msa-plan mirrors themselves, so the
// Python names return exactly what the planner and the task-build kernels use.

fn plan_err(e: msa_plan::PlanError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `rows_per_cta(num_rows)`: the CTA walk length (msa-plan `backward::rows_per_cta`).
#[pyfunction]
fn rows_per_cta(num_rows: usize) -> usize {
    msa_plan::backward::rows_per_cta(num_rows)
}

/// `chunk_map(num_rows, rows_per_cta, num_sms) -> (num_full_ctas, tail_rows, grid_ctas)`;
/// `ValueError` for a zero `rows_per_cta` or `num_sms` (the Rust mirror asserts them).
#[pyfunction]
fn chunk_map(
    num_rows: usize,
    rows_per_cta: usize,
    num_sms: usize,
) -> PyResult<(usize, usize, usize)> {
    if rows_per_cta == 0 || num_sms == 0 {
        return Err(PyValueError::new_err(format!(
            "chunk_map needs rows_per_cta > 0 and num_sms > 0, got rows_per_cta={rows_per_cta}, \
             num_sms={num_sms}"
        )));
    }
    Ok(msa_plan::backward::chunk_map(
        num_rows,
        rows_per_cta,
        num_sms,
    ))
}

/// `grid_launch_bound(capacity, num_sms)`: CTAs that cover every task count up to `capacity`.
#[pyfunction]
fn grid_launch_bound(capacity: usize, num_sms: usize) -> usize {
    msa_plan::backward::grid_launch_bound(capacity, num_sms)
}

/// `task_build_storage(edge_capacity, work_capacity, num_tokens, workspace_rows) ->
/// (scratch_words, table_words)`, NeMo's messages for a bad workspace or too many bins.
#[pyfunction]
fn task_build_storage(
    edge_capacity: usize,
    work_capacity: usize,
    num_tokens: usize,
    workspace_rows: usize,
) -> PyResult<(usize, usize)> {
    let s = msa_plan::backward::task_build_buffer_sizes(
        edge_capacity,
        work_capacity,
        num_tokens,
        workspace_rows,
    )
    .map_err(plan_err)?;
    Ok((s.scratch_words, s.table_words))
}

/// One schedule tensor from Python: flat int32 values and its shape.
type Part = (Vec<i32>, Vec<usize>);

/// The validated schedule from its six tensors in NeMo's field order (NeMo's shape messages).
fn schedule(parts: [Part; 6]) -> PyResult<msa_plan::backward::MsaBackwardSchedule> {
    use msa_plan::backward::{Int32Array, MsaBackwardSchedule, ScheduleParts};
    let [rp, qi, sm, wc, cu, dws] = parts.map(|(d, s)| Int32Array::new(d, &s));
    MsaBackwardSchedule::new(ScheduleParts {
        row_ptr: rp,
        q_indices: qi,
        scheduler_metadata: sm,
        work_count: wc,
        cu_seqlens: cu,
        document_workspace_starts: dws,
        query_offsets: None,
    })
    .map_err(plan_err)
}

/// `check_backward_schedule(parts)`: `ValueError` with NeMo's message for a bad shape.
#[pyfunction]
fn check_backward_schedule(parts: [Part; 6]) -> PyResult<()> {
    schedule(parts).map(|_| ())
}

/// `build_backward_tasks(parts, num_tokens, workspace_rows, num_sms) -> (scratch, tables,
/// grid_launch)`: the four task-build stages of msa-plan's host mirror, as the buffers' words.
#[pyfunction]
fn build_backward_tasks(
    py: Python<'_>,
    parts: [Part; 6],
    num_tokens: usize,
    workspace_rows: usize,
    num_sms: usize,
) -> PyResult<(Vec<i32>, Vec<i32>, usize)> {
    let s = schedule(parts)?;
    let t = py
        .detach(|| {
            msa_plan::backward::build_backward_tasks(&s, num_tokens, workspace_rows, num_sms)
        })
        .map_err(plan_err)?;
    Ok((t.scratch_image(), t.table_image(), t.grid_launch))
}

#[pymodule]
#[pyo3(name = "_C")]
fn c_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TopKError", py.get_type::<TopKError>())?;
    m.add_class::<PyCallShape>()?;
    m.add("LAYOUT_NAMES", calls::LAYOUT_NAMES.to_vec())?;
    m.add("METADATA_NAMES", calls::METADATA_NAMES.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(sizes, m)?)?;
    m.add_function(wrap_pyfunction!(built_archs, m)?)?;
    m.add_function(wrap_pyfunction!(served_by, m)?)?;
    m.add_function(wrap_pyfunction!(unsupported_reason, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_set, m)?)?;
    m.add_function(wrap_pyfunction!(backward_path, m)?)?;
    m.add_function(wrap_pyfunction!(device_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(build_layout, m)?)?;
    m.add_function(wrap_pyfunction!(prepare, m)?)?;
    m.add_function(wrap_pyfunction!(validate_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_forward, m)?)?;
    m.add_function(wrap_pyfunction!(selection_lse, m)?)?;
    m.add_function(wrap_pyfunction!(kl_backward, m)?)?;
    m.add_function(wrap_pyfunction!(rows_per_cta, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_map, m)?)?;
    m.add_function(wrap_pyfunction!(grid_launch_bound, m)?)?;
    m.add_function(wrap_pyfunction!(task_build_storage, m)?)?;
    m.add_function(wrap_pyfunction!(check_backward_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(build_backward_tasks, m)?)?;
    Ok(())
}
