//! The one way the facade hands cudarc buffers to [`crate::raw`]: [`Views`] checks that each
//! buffer belongs to the facade's context, takes its device address through cudarc's
//! `device_ptr` / `device_ptr_mut` and keeps the returned guard alive until the `Views` is
//! dropped, i.e. after the raw call has enqueued every launch that uses the address (cudarc
//! records its stream-ordering events when a guard drops, so dropping it earlier would order the
//! event before the kernel).

use std::sync::Arc;

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use super::CudaMsa;
use crate::error::{MsaError, Result};
use crate::raw::{DevSlice, DevSliceMut, Elem, Stream};

/// Device views of cudarc buffers for one raw call, holding their guards.
pub(crate) struct Views<'a> {
    msa: &'a CudaMsa,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Views<'a> {
    /// Binds the facade's context to the calling thread (the C launchers run in the runtime's
    /// current context).
    pub(crate) fn new(msa: &'a CudaMsa) -> Result<Self> {
        msa.context().bind_to_thread()?;
        Ok(Self {
            msa,
            guards: Vec::new(),
        })
    }

    /// The facade's stream, as the raw layer takes it.
    pub(crate) fn stream(&self) -> Stream {
        self.msa.raw_stream()
    }

    fn same_context<T, B: DeviceSlice<T>>(&self, name: &'static str, buf: &B) -> Result<()> {
        if !Arc::ptr_eq(buf.stream().context(), self.msa.context()) {
            return Err(MsaError::ForeignContext { name });
        }
        Ok(())
    }

    /// The view's length: the buffer's, except that the facade stores an empty tensor as a
    /// 1-element allocation (cudarc allocates at least one element), which is a 0-length view
    /// where `expected` is 0.
    fn len(buf_len: usize, expected: usize) -> usize {
        if expected == 0 && buf_len == 1 {
            0
        } else {
            buf_len
        }
    }

    /// A read-only view of `buf` (named `name` in errors), `expected` elements long for the call
    /// (only used to map the 1-element placeholder of an empty tensor; the raw call checks the
    /// length).
    pub(crate) fn read<T: Elem, B: DevicePtr<T>>(
        &mut self,
        name: &'static str,
        buf: &'a B,
        expected: usize,
    ) -> Result<DevSlice<T>> {
        self.same_context(name, buf)?;
        let len = Self::len(buf.len(), expected);
        let (addr, guard) = buf.device_ptr(self.msa.stream());
        self.guards.push(guard);
        // SAFETY: `addr` is a live allocation of this context holding `buf.len() >= len`
        // elements; the guard (held until `self` drops) and the borrow of `buf` keep it alive
        // until the raw call has enqueued its launches, which cudarc's stream-ordered free then
        // follows.
        Ok(unsafe { DevSlice::new(addr, len) })
    }

    /// A writable view of `buf`, as [`Views::read`].
    pub(crate) fn write<T: Elem, B: DevicePtrMut<T>>(
        &mut self,
        name: &'static str,
        buf: &'a mut B,
        expected: usize,
    ) -> Result<DevSliceMut<T>> {
        self.same_context(name, &*buf)?;
        let len = Self::len(buf.len(), expected);
        let (addr, guard) = buf.device_ptr_mut(self.msa.stream());
        self.guards.push(guard);
        // SAFETY: as `read`; the exclusive borrow of `buf` lasts as long as the view may be used.
        Ok(unsafe { DevSliceMut::new(addr, len) })
    }

    /// A scratch buffer as a workspace view of its full length.
    pub(crate) fn workspace<B: DevicePtrMut<u8>>(
        &mut self,
        name: &'static str,
        buf: &'a mut B,
    ) -> Result<DevSliceMut<u8>> {
        let len = buf.len();
        self.write(name, buf, len)
    }
}
