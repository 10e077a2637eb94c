//! The public CUDA API of the attention (docs/contract.md §2.4): forward and backward (atomic or
//! deterministic) on the metadata of `prepare`. Every entry checks sizes before
//! any launch and allocates its outputs through [`CudaMsa::output`] (poisoned when asked).

use cudarc::driver::CudaSlice;
use half::bf16;
use msa_plan::topology::{BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS};

use super::attention_bwd::{
    launch_backward_deterministic, launch_backward_main, Accumulators, BackwardTensors,
    DevicePhysicalCsr, Gradients, TaskBuffers,
};
use super::attention_fwd::{launch_forward, ForwardInputs};
use super::{CudaMsa, Metadata};
use crate::error::Result;

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
    /// Bitwise-repeatable gradients: dQ query-outer and dK/dV physical-block-outer, no atomics.
    pub deterministic: bool,
}

impl Metadata {
    pub(crate) fn physical_csr(&self) -> DevicePhysicalCsr<'_> {
        DevicePhysicalCsr {
            row_ptr: self.phys_row_ptr(),
            q_indices: self.phys_q_indices(),
            valid: self.phys_valid(),
        }
    }
}

impl CudaMsa {
    /// Sparse attention forward over `meta`'s selection.
    pub fn forward(
        &self,
        meta: &Metadata,
        q: &CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
    ) -> Result<DeviceForward> {
        let layout = meta.layout();
        let t = layout.host().total_q();
        let mut out = self.output::<bf16>(t * NUM_Q_HEADS * HEAD_DIM)?;
        let mut lse = self.output::<f32>(t * NUM_Q_HEADS)?;
        launch_forward(
            self,
            layout,
            &ForwardInputs {
                q,
                k,
                v,
                topk: meta.topk(),
            },
            &mut out,
            &mut lse,
        )?;
        Ok(DeviceForward { out, lse })
    }

    /// dQ, dK, dV from the forward's `out` and `lse`: delta preprocess, then either the device
    /// task build + the KV-parallel main kernel (fp32 atomics) + the bf16 postprocess, or the
    /// deterministic pair. Keys no query selected get exact zeros.
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
        let layout = meta.layout();
        let h = layout.host();
        let (t, tk) = (h.total_q(), h.total_k());
        let mut delta = self.output::<f32>(t * NUM_Q_HEADS)?;
        self.backward_delta_into(layout, out, dout, &mut delta)?;
        let tensors = BackwardTensors {
            q,
            k,
            v,
            dout,
            lse,
            delta: &delta,
        };
        let mut dq = self.output::<bf16>(t * NUM_Q_HEADS * HEAD_DIM)?;
        let mut dk = self.output::<bf16>(tk * NUM_KV_HEADS * HEAD_DIM)?;
        let mut dv = self.output::<bf16>(tk * NUM_KV_HEADS * HEAD_DIM)?;
        if opts.deterministic {
            let grads = Gradients {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            };
            launch_backward_deterministic(
                self,
                layout,
                &tensors,
                meta.topk(),
                &meta.physical_csr(),
                grads,
            )?;
        } else {
            let tasks = self.task_build(meta)?;
            let pool = h.padded_kv_blocks() * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM;
            let mut dq_accum = self.zeros::<f32>(t * NUM_Q_HEADS * HEAD_DIM)?;
            let mut dk_pool = self.zeros::<f32>(pool)?;
            let mut dv_pool = self.zeros::<f32>(pool)?;
            let buffers = TaskBuffers {
                tables: tasks.tables(),
                scratch: tasks.scratch(),
                capacity: tasks.sizes().capacity,
                grid_launch: tasks.grid_launch(),
            };
            let acc = Accumulators {
                dq: &mut dq_accum,
                dk_pool: &mut dk_pool,
                dv_pool: &mut dv_pool,
            };
            launch_backward_main(self, layout, &tensors, &buffers, acc)?;
            self.backward_postprocess_dq_into(layout, &dq_accum, &mut dq)?;
            self.backward_postprocess_dkv_into(layout, &dk_pool, &dv_pool, &mut dk, &mut dv)?;
        }
        Ok(DeviceGrads { dq, dk, dv })
    }
}
