//! The public CUDA API of the attention (docs/contract.md §2.4): forward and backward (atomic or
//! deterministic) on the metadata of `prepare`. Each allocates its outputs through
//! [`CudaMsa::output`] (poisoned when asked) and its workspace, then calls [`raw::forward`] /
//! [`raw::backward`], which check every size before any launch.

use cudarc::driver::CudaSlice;
use half::bf16;

use super::{CudaMsa, Metadata, Views};
use crate::error::Result;
use crate::raw;

/// Views of q `[T, 64, 128]`, k, v `[Tk, 4, 128]` whose guards `g` holds.
pub(super) fn attention_views<'v>(
    g: &mut Views<'v>,
    q: &'v CudaSlice<bf16>,
    k: &'v CudaSlice<bf16>,
    v: &'v CudaSlice<bf16>,
    s: &raw::Sizes,
) -> Result<raw::AttentionInputs> {
    Ok(raw::AttentionInputs {
        q: g.read("q", q, s.queries)?,
        k: g.read("k", k, s.keys)?,
        v: g.read("v", v, s.keys)?,
    })
}

/// Forward outputs: `out` bf16 `[T, 64, 128]`, `lse` f32 `[T, 64]` (natural log).
pub struct DeviceForward {
    pub out: CudaSlice<bf16>,
    pub lse: CudaSlice<f32>,
}

/// Attention gradients, bf16, shapes of q, k, v.
pub struct DeviceGrads {
    pub dq: CudaSlice<bf16>,
    pub dk: CudaSlice<bf16>,
    pub dv: CudaSlice<bf16>,
}

/// Backward choices.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackwardOptions {
    /// Bitwise-repeatable gradients: on Hopper the sm_90a kernel with a fixed accumulation
    /// order ([`raw::BackwardPath::Deterministic`]), with [`CudaMsa::with_sm80_kernels`] or
    /// elsewhere the sm_80 pair (dQ query-outer, dK/dV physical-block-outer, no atomics).
    pub deterministic: bool,
}

impl CudaMsa {
    /// The backward path this handle runs for `opts` (`raw::BackwardPath::select` on
    /// [`CudaMsa::kernel_set`]).
    pub fn backward_path(&self, opts: BackwardOptions) -> raw::BackwardPath {
        raw::BackwardPath::select(opts.deterministic, self.kernel_set())
    }

    /// Sparse attention forward over `meta`'s selection (the validated top-k is all it reads, so
    /// [`CudaMsa::prepare_forward`]'s metadata suffices): the sm_90a kernel on Hopper unless
    /// [`CudaMsa::with_sm80_kernels`], with its workspace (claim counter, tile unions, claim order); the mma.sync kernel
    /// elsewhere.
    pub fn forward(
        &self,
        meta: &Metadata,
        q: &CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
    ) -> Result<DeviceForward> {
        let layout = meta.layout();
        let shape = layout.shape();
        let s = shape.sizes();
        let kernels = self.kernel_set();
        let mut out = self.output::<bf16>(s.queries)?;
        let mut lse = self.output::<f32>(s.query_heads)?;
        let mut workspace = self.scratch(s.forward_workspace_bytes(kernels))?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let topk = g.read("topk_indices", meta.topk(), s.selection)?;
            let inputs = attention_views(&mut g, q, k, v, s)?;
            let mut outputs = raw::ForwardOutputs {
                out: g.write("out", &mut out, s.queries)?,
                lse: g.write("lse", &mut lse, s.query_heads)?,
            };
            let ws = g.workspace("forward workspace", &mut workspace)?;
            // SAFETY: every view is a live allocation of this context (guards held by `g` until
            // the launch is enqueued; the workspace is freed in stream order after it), the
            // stream is the context's, the layout and metadata are this call's.
            unsafe {
                raw::forward(
                    shape,
                    &lay,
                    topk,
                    &inputs,
                    &mut outputs,
                    kernels,
                    ws,
                    g.stream(),
                )?
            };
        }
        Ok(DeviceForward { out, lse })
    }

    /// dQ, dK, dV from the forward's `out` and `lse`: delta preprocess, then on Hopper the sm_90a
    /// KV-outer backward over prepare's physical CSR (unless [`CudaMsa::with_sm80_kernels`]),
    /// elsewhere the device task build + the KV-parallel main kernel (fp32 atomics) + the bf16
    /// postprocess; with `deterministic`, the same kernels' bitwise-repeatable mode (the sm_90a
    /// kernel with ordered accumulation, or the sm_80 pair). Keys no query selected get exact
    /// zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        meta: &Metadata,
        q: &CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
        dout: &CudaSlice<bf16>,
        out: &CudaSlice<bf16>,
        lse: &CudaSlice<f32>,
        opts: BackwardOptions,
    ) -> Result<DeviceGrads> {
        // Before any allocation (a poisoned one launches a fill).
        let tables = meta.tables("backward")?;
        let layout = meta.layout();
        let shape = layout.shape();
        let s = shape.sizes();
        let path = self.backward_path(opts);
        let mut dq = self.output::<bf16>(s.queries)?;
        let mut dk = self.output::<bf16>(s.keys)?;
        let mut dv = self.output::<bf16>(s.keys)?;
        let mut workspace = self.scratch(s.backward_workspace_bytes(path))?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let m = meta.views(&mut g, tables)?;
            let inputs = raw::BackwardInputs {
                q: g.read("q", q, s.queries)?,
                k: g.read("k", k, s.keys)?,
                v: g.read("v", v, s.keys)?,
                dout: g.read("dout", dout, s.queries)?,
                out: g.read("out", out, s.queries)?,
                lse: g.read("lse", lse, s.query_heads)?,
            };
            let mut grads = raw::Gradients {
                dq: g.write("dq", &mut dq, s.queries)?,
                dk: g.write("dk", &mut dk, s.keys)?,
                dv: g.write("dv", &mut dv, s.keys)?,
            };
            let ws = g.workspace("backward workspace", &mut workspace)?;
            // SAFETY: as in `forward`.
            unsafe { raw::backward(shape, &lay, &m, &inputs, &mut grads, path, ws, g.stream())? };
        }
        Ok(DeviceGrads { dq, dk, dv })
    }
}
