//! The packed varlen layout on the device: the caller's cu_seqlens plus the arrays
//! [`build_layout`] derives from them (kernels/include/msa/common.h `MsaVarlen`).

use msa_kernels::{launch, sys};

use super::check;
use super::shape::CallShape;
use super::view::{DevSlice, DevSliceMut, Stream};
use crate::error::Result;

/// The device arrays of one layout, as every kernel reads them: `cu_seqlens_q`, `cu_seqlens_k`
/// `[B + 1]` (the caller's) and `fragment_first [B]`, `query_fragment [T]`, `block_key_start`,
/// `block_key_count [P]` (from [`build_layout`]).
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub cu_seqlens_q: DevSlice<i32>,
    pub cu_seqlens_k: DevSlice<i32>,
    pub fragment_first: DevSlice<i32>,
    pub query_fragment: DevSlice<i32>,
    pub block_key_start: DevSlice<i32>,
    pub block_key_count: DevSlice<i32>,
}

/// The outputs of [`build_layout`]: `fragment_first [B]`, `query_fragment [T]`,
/// `block_key_start`, `block_key_count [P]` (i32).
#[derive(Debug)]
pub struct LayoutOutputs {
    pub fragment_first: DevSliceMut<i32>,
    pub query_fragment: DevSliceMut<i32>,
    pub block_key_start: DevSliceMut<i32>,
    pub block_key_count: DevSliceMut<i32>,
}

impl LayoutOutputs {
    /// The layout these outputs complete, with the cu_seqlens they were derived from.
    pub fn layout(&self, cu_seqlens_q: DevSlice<i32>, cu_seqlens_k: DevSlice<i32>) -> Layout {
        Layout {
            cu_seqlens_q,
            cu_seqlens_k,
            fragment_first: self.fragment_first.as_slice(),
            query_fragment: self.query_fragment.as_slice(),
            block_key_start: self.block_key_start.as_slice(),
            block_key_count: self.block_key_count.as_slice(),
        }
    }
}

impl Layout {
    /// Checks every array against `shape`.
    pub(crate) fn check(&self, shape: &CallShape) -> Result<()> {
        let s = shape.sizes();
        check::index_array("cu_seqlens_q", &self.cu_seqlens_q, s.cu_seqlens, "[B + 1]")?;
        check::index_array("cu_seqlens_k", &self.cu_seqlens_k, s.cu_seqlens, "[B + 1]")?;
        check::tensor("fragment_first", &self.fragment_first, s.batch, "[B]")?;
        check::tensor(
            "query_fragment",
            &self.query_fragment,
            s.query_fragment,
            "[T]",
        )?;
        check::tensor(
            "block_key_start",
            &self.block_key_start,
            s.block_keys,
            "[P]",
        )?;
        check::tensor(
            "block_key_count",
            &self.block_key_count,
            s.block_keys,
            "[P]",
        )
    }

    /// The by-value kernel argument (checked against `shape` first by every caller).
    pub(crate) fn varlen(&self, shape: &CallShape) -> sys::MsaVarlen {
        sys::MsaVarlen {
            cu_seqlens_q: self.cu_seqlens_q.ptr(),
            cu_seqlens_k: self.cu_seqlens_k.ptr(),
            fragment_first: self.fragment_first.ptr(),
            query_fragment: self.query_fragment.ptr(),
            block_key_start: self.block_key_start.ptr(),
            block_key_count: self.block_key_count.ptr(),
            ..shape.varlen_sizes()
        }
    }
}

/// Derive `out` from `cu_seqlens_q`, `cu_seqlens_k` (`[B + 1]`) and `fragment_indices` (`[B]`,
/// `Some` exactly when `shape.has_fragments()`) on the device, with `msa_plan::VarlenLayout`'s
/// rule word for word (`fragment_first`, `query_fragments`, `physical_block_keys`): one kernel,
/// no host synchronization, graph-capturable. Lengths are checked before the launch.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launch has run; `stream` must be a live stream of that context.
/// The cu_seqlens and fragment_indices must form the layout `shape` describes (the rules of
/// `msa_plan::VarlenLayout::new`, `cu_seqlens_q[B] = T`, `cu_seqlens_k[B] = Tk`, and R and
/// `max_seqlen_k` those of the layout): the kernels of the call trust it, as MSA's do.
pub unsafe fn build_layout(
    shape: &CallShape,
    cu_seqlens_q: DevSlice<i32>,
    cu_seqlens_k: DevSlice<i32>,
    fragment_indices: Option<DevSlice<i32>>,
    out: &mut LayoutOutputs,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    check::index_array("cu_seqlens_q", &cu_seqlens_q, s.cu_seqlens, "[B + 1]")?;
    check::index_array("cu_seqlens_k", &cu_seqlens_k, s.cu_seqlens, "[B + 1]")?;
    match (fragment_indices, shape.has_fragments()) {
        (Some(f), true) => check::index_array("fragment_indices", &f, s.batch, "[B]")?,
        (None, false) => {}
        (given, _) => {
            return Err(crate::MsaError::Tensor {
                name: "fragment_indices",
                expected: if shape.has_fragments() {
                    format!("[{}] i32 (the shape has fragments)", s.batch)
                } else {
                    "none (the shape has no fragments)".into()
                },
                got: format!("{given:?}"),
            })
        }
    }
    check::output("fragment_first", &out.fragment_first, s.batch, "[B]")?;
    check::output(
        "query_fragment",
        &out.query_fragment,
        s.query_fragment,
        "[T]",
    )?;
    check::output("block_key_start", &out.block_key_start, s.block_keys, "[P]")?;
    check::output("block_key_count", &out.block_key_count, s.block_keys, "[P]")?;
    let v = shape.varlen_sizes();
    let outputs = sys::MsaLayoutOutputs {
        fragment_first: out.fragment_first.ptr(),
        query_fragment: out.query_fragment.ptr(),
        block_key_start: out.block_key_start.ptr(),
        block_key_count: out.block_key_count.ptr(),
    };
    // SAFETY: lengths checked above against `shape`; the caller's contract covers the memory,
    // the stream and the layout's validity.
    unsafe {
        launch::prepare::layout(
            cu_seqlens_q.addr(),
            cu_seqlens_k.addr(),
            fragment_indices.map_or(0, |f| f.addr()),
            v.batch,
            v.total_q,
            v.total_k,
            v.padded_kv_blocks,
            outputs,
            stream.as_raw(),
        )?
    };
    Ok(())
}
