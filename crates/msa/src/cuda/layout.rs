//! The packed varlen layout on the device, shared by every kernel of a call: the host layout
//! (kept for the facade's host-side checks and messages) plus its device arrays. Only
//! cu_seqlens_q/k and fragment_indices are uploaded; the rest is derived on the device by
//! [`raw::build_layout`].

use cudarc::driver::CudaSlice;
use msa_plan::VarlenLayout;

use super::{CudaMsa, Views};
use crate::error::Result;
use crate::raw;

/// A validated host layout plus its device arrays (`MsaVarlen` of kernels/include/msa/common.h).
pub struct DeviceLayout {
    host: VarlenLayout,
    shape: raw::CallShape,
    cu_seqlens_q: CudaSlice<i32>,
    cu_seqlens_k: CudaSlice<i32>,
    fragment_indices: Option<CudaSlice<i32>>,
    fragment_first: CudaSlice<i32>,
    query_fragment: CudaSlice<i32>,
    block_key_start: CudaSlice<i32>,
    block_key_count: CudaSlice<i32>,
}

impl DeviceLayout {
    /// Upload `host`'s cu_seqlens (and fragment_indices) and derive the other arrays on the
    /// device (no host synchronization).
    pub fn new(msa: &CudaMsa, host: VarlenLayout) -> Result<Self> {
        let shape = msa.call_shape(&host)?;
        let s = shape.sizes();
        let mut layout = Self {
            cu_seqlens_q: msa.upload(host.cu_seqlens_q())?,
            cu_seqlens_k: msa.upload(host.cu_seqlens_k())?,
            fragment_indices: host.fragment_indices().map(|f| msa.upload(f)).transpose()?,
            fragment_first: msa.output(s.batch)?,
            query_fragment: msa.output(s.query_fragment)?,
            block_key_start: msa.output(s.block_keys)?,
            block_key_count: msa.output(s.block_keys)?,
            host,
            shape,
        };
        layout.build(msa)?;
        Ok(layout)
    }

    fn build(&mut self, msa: &CudaMsa) -> Result<()> {
        let s = self.shape.sizes();
        let mut v = Views::new(msa)?;
        let cu_q = v.read("cu_seqlens_q", &self.cu_seqlens_q, s.cu_seqlens)?;
        let cu_k = v.read("cu_seqlens_k", &self.cu_seqlens_k, s.cu_seqlens)?;
        let frag = match &self.fragment_indices {
            Some(f) => Some(v.read("fragment_indices", f, s.batch)?),
            None => None,
        };
        let mut out = raw::LayoutOutputs {
            fragment_first: v.write("fragment_first", &mut self.fragment_first, s.batch)?,
            query_fragment: v.write(
                "query_fragment",
                &mut self.query_fragment,
                s.query_fragment,
            )?,
            block_key_start: v.write("block_key_start", &mut self.block_key_start, s.block_keys)?,
            block_key_count: v.write("block_key_count", &mut self.block_key_count, s.block_keys)?,
        };
        // SAFETY: every view is a live allocation of this context (guards held by `v` until the
        // launch is enqueued) and the stream is the context's; the cu_seqlens and
        // fragment_indices are the validated host layout's, which `shape` describes.
        unsafe { raw::build_layout(&self.shape, cu_q, cu_k, frag, &mut out, v.stream()) }
    }

    /// The host layout.
    pub fn host(&self) -> &VarlenLayout {
        &self.host
    }

    /// The raw layer's shape of this layout (sizes of every tensor of a call).
    pub fn shape(&self) -> &raw::CallShape {
        &self.shape
    }

    pub fn cu_seqlens_q(&self) -> &CudaSlice<i32> {
        &self.cu_seqlens_q
    }

    pub fn cu_seqlens_k(&self) -> &CudaSlice<i32> {
        &self.cu_seqlens_k
    }

    /// `[B]`: the document's first fragment of each fragment (derived on the device).
    pub fn fragment_first(&self) -> &CudaSlice<i32> {
        &self.fragment_first
    }

    /// `[T]`: the fragment of each packed query (derived on the device).
    pub fn query_fragment(&self) -> &CudaSlice<i32> {
        &self.query_fragment
    }

    /// `[P]`: packed K row of each physical block's key 0, -1 for padding (derived on the
    /// device).
    pub fn block_key_start(&self) -> &CudaSlice<i32> {
        &self.block_key_start
    }

    /// `[P]`: keys stored in each physical block, 0 for padding (derived on the device).
    pub fn block_key_count(&self) -> &CudaSlice<i32> {
        &self.block_key_count
    }

    /// The raw views of the layout's arrays, guards held by `v`.
    pub(crate) fn views<'a>(&'a self, v: &mut Views<'a>) -> Result<raw::Layout> {
        let s = self.shape.sizes();
        Ok(raw::Layout {
            cu_seqlens_q: v.read("cu_seqlens_q", &self.cu_seqlens_q, s.cu_seqlens)?,
            cu_seqlens_k: v.read("cu_seqlens_k", &self.cu_seqlens_k, s.cu_seqlens)?,
            fragment_first: v.read("fragment_first", &self.fragment_first, s.batch)?,
            query_fragment: v.read("query_fragment", &self.query_fragment, s.query_fragment)?,
            block_key_start: v.read("block_key_start", &self.block_key_start, s.block_keys)?,
            block_key_count: v.read("block_key_count", &self.block_key_count, s.block_keys)?,
        })
    }
}
