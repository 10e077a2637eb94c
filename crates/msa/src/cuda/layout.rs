//! The packed varlen layout on the device: uploaded once, shared by every kernel of a call.

use cudarc::driver::CudaSlice;
use msa_kernels::sys::MsaVarlen;
use msa_plan::VarlenLayout;

use super::{dptr, CudaMsa};
use crate::error::Result;

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
