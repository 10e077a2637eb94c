//! The packed varlen layout on the device: uploaded once, shared by every kernel of a call.

use cudarc::driver::CudaSlice;
use msa_kernels::sys::MsaVarlen;
use msa_plan::VarlenLayout;

use msa_plan::topology::{
    BLOCK_SIZE, HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};

use super::{dptr, CudaMsa};
use crate::error::{check_len, Result};

/// A tensor shape of the contract, sized by a layout (T queries, Tk keys, P physical blocks).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    /// `[T, 64, 128]`: q, out, dout, dq, dq_accum.
    Queries,
    /// `[Tk, 4, 128]`: k, v, dk, dv.
    Keys,
    /// `[T, 64]`: lse, delta.
    QueryHeads,
    /// `[4, T, 16]`: selections, and the `[4, T·16]` edge tables of the CSRs.
    Selection,
    /// `[T, 4, 128]`: qi, dqi.
    IndexQueries,
    /// `[Tk, 1, 128]`: ki, dki.
    IndexKeys,
    /// `[4, T]`: indexer LSE.
    IndexHeads,
    /// `[W, 4, 128]`, W = 128·P: the fp32 dK/dV workspace pools.
    Pool,
    /// `[4, P + 1]`: physical CSR row pointers.
    PhysicalRows,
}

/// A validated host layout plus its device arrays (`MsaVarlen` of kernels/include/msa/common.h).
pub struct DeviceLayout {
    host: VarlenLayout,
    cu_seqlens_q: CudaSlice<i32>,
    cu_seqlens_k: CudaSlice<i32>,
    fragment_first: CudaSlice<i32>,
    query_fragment: CudaSlice<i32>,
    block_key_start: CudaSlice<i32>,
    block_key_count: CudaSlice<i32>,
}

impl DeviceLayout {
    pub fn new(msa: &CudaMsa, host: VarlenLayout) -> Result<Self> {
        let (block_key_start, block_key_count) = host.physical_block_keys();
        Ok(Self {
            cu_seqlens_q: msa.upload(host.cu_seqlens_q())?,
            cu_seqlens_k: msa.upload(host.cu_seqlens_k())?,
            fragment_first: msa.upload(&host.fragment_first())?,
            query_fragment: msa.upload(&host.query_fragments())?,
            block_key_start: msa.upload(&block_key_start)?,
            block_key_count: msa.upload(&block_key_count)?,
            host,
        })
    }

    pub fn host(&self) -> &VarlenLayout {
        &self.host
    }

    /// Checks `buf` against `shape` before any launch. [`CudaMsa`] allocates at least one
    /// element, so an empty tensor arrives as a 1-element buffer.
    pub(crate) fn check<T>(
        &self,
        name: &'static str,
        buf: &CudaSlice<T>,
        shape: Shape,
    ) -> Result<()> {
        let h = &self.host;
        let (t, tk, p) = (h.total_q(), h.total_k(), h.padded_kv_blocks());
        let (n, text) = match shape {
            Shape::Queries => (t * NUM_Q_HEADS * HEAD_DIM, "[T, 64, 128]"),
            Shape::Keys => (tk * NUM_KV_HEADS * HEAD_DIM, "[Tk, 4, 128]"),
            Shape::QueryHeads => (t * NUM_Q_HEADS, "[T, 64]"),
            Shape::Selection => (NUM_KV_HEADS * t * TOPK_BLOCKS, "[4, T, 16]"),
            Shape::IndexQueries => (t * NUM_INDEX_HEADS * INDEX_DIM, "[T, 4, 128]"),
            Shape::IndexKeys => (tk * INDEX_DIM, "[Tk, 1, 128]"),
            Shape::IndexHeads => (NUM_INDEX_HEADS * t, "[4, T]"),
            Shape::Pool => (p * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM, "[W, 4, 128]"),
            Shape::PhysicalRows => (NUM_KV_HEADS * (p + 1), "[4, P + 1]"),
        };
        if n == 0 && buf.len() == 1 {
            return Ok(());
        }
        check_len(name, buf.len(), n, text)
    }

    pub fn cu_seqlens_q(&self) -> &CudaSlice<i32> {
        &self.cu_seqlens_q
    }

    /// The by-value kernel argument.
    pub(crate) fn varlen(&self, msa: &CudaMsa) -> MsaVarlen {
        let s = msa.stream();
        let h = &self.host;
        MsaVarlen {
            cu_seqlens_q: dptr(&self.cu_seqlens_q, s) as *const i32,
            cu_seqlens_k: dptr(&self.cu_seqlens_k, s) as *const i32,
            fragment_first: dptr(&self.fragment_first, s) as *const i32,
            query_fragment: dptr(&self.query_fragment, s) as *const i32,
            block_key_start: dptr(&self.block_key_start, s) as *const i32,
            block_key_count: dptr(&self.block_key_count, s) as *const i32,
            batch: h.batch() as i32,
            total_q: h.total_q() as i32,
            total_k: h.total_k() as i32,
            total_rows: h.total_rows() as i32,
            padded_kv_blocks: h.padded_kv_blocks() as i32,
            max_blocks: h.max_blocks() as i32,
        }
    }
}
