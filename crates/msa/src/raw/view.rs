//! Typed views of caller-owned device memory and the caller's stream.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;

use half::bf16;

mod sealed {
    pub trait Sealed {}
}

/// An element type of an MSA device tensor: `bf16` (q, k, v, gradients), `f32` (LSEs, delta,
/// accumulators), `i32` (selections, layout and metadata arrays) and `u8` (workspaces).
pub trait Elem: sealed::Sealed + Copy + 'static {
    /// The dtype's name in messages.
    const NAME: &'static str;
}

macro_rules! elem {
    ($t:ty, $name:literal) => {
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const NAME: &'static str = $name;
        }
    };
}
elem!(bf16, "bf16");
elem!(f32, "f32");
elem!(i32, "i32");
elem!(u32, "u32");
elem!(u8, "u8");

/// A read-only view of `len` elements of `T` at device address `addr` (a `CUdeviceptr`, what
/// `torch.Tensor.data_ptr()` or cudarc's `device_ptr` gives). Copy: the raw layer never owns
/// memory.
pub struct DevSlice<T: Elem> {
    addr: u64,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Elem> Clone for DevSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Elem> Copy for DevSlice<T> {}

impl<T: Elem> fmt::Debug for DevSlice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevSlice<{}>({:#x}, {})", T::NAME, self.addr, self.len)
    }
}

impl<T: Elem> DevSlice<T> {
    /// A view of `len` elements at `addr`.
    ///
    /// # Safety
    /// `addr` must be device memory holding `len` elements of `T` (or any value when `len` is 0),
    /// usable from the context the launches run in, and stay allocated until every launch that
    /// reads it has run (stream order).
    pub unsafe fn new(addr: u64, len: usize) -> Self {
        Self {
            addr,
            len,
            _elem: PhantomData,
        }
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Elements of `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes, `len · size_of::<T>()`.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    pub(crate) fn ptr(&self) -> *const T {
        self.addr as *const T
    }
}

/// A writable view of `len` elements of `T` at device address `addr`. Not `Copy`: an output is
/// handed to one launch at a time ([`DevSliceMut::as_slice`] gives a read-only copy).
pub struct DevSliceMut<T: Elem> {
    addr: u64,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Elem> fmt::Debug for DevSliceMut<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DevSliceMut<{}>({:#x}, {})",
            T::NAME,
            self.addr,
            self.len
        )
    }
}

impl<T: Elem> DevSliceMut<T> {
    /// A writable view of `len` elements at `addr`.
    ///
    /// # Safety
    /// As [`DevSlice::new`], and nothing else may read or write the memory concurrently with a
    /// launch that writes it (other than in stream order).
    pub unsafe fn new(addr: u64, len: usize) -> Self {
        Self {
            addr,
            len,
            _elem: PhantomData,
        }
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Elements of `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes, `len · size_of::<T>()`.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The same memory, read-only.
    pub fn as_slice(&self) -> DevSlice<T> {
        DevSlice {
            addr: self.addr,
            len: self.len,
            _elem: PhantomData,
        }
    }

    pub(crate) fn ptr(&self) -> *mut T {
        self.addr as *mut T
    }

    /// The sub-view of `len` elements of `U` starting `offset` bytes in (a carve of a workspace;
    /// the caller keeps it inside this view).
    pub(crate) fn carve<U: Elem>(&self, offset: usize, len: usize) -> DevSliceMut<U> {
        debug_assert!(offset + len * std::mem::size_of::<U>() <= self.bytes());
        DevSliceMut {
            addr: self.addr + offset as u64,
            len,
            _elem: PhantomData,
        }
    }
}

/// A `cudaStream_t` / `CUstream` of the caller (`torch.cuda.current_stream().cuda_stream`,
/// cudarc's `CudaStream::cu_stream()`); [`Stream::LEGACY`] is the legacy default stream.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct Stream(*mut c_void);

// SAFETY: a stream handle is an opaque driver handle; CUDA allows enqueuing on it from any
// thread. The raw layer never dereferences it.
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is only passed by value to the CUDA runtime.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:p})", self.0)
    }
}

impl Stream {
    /// The legacy default stream (null).
    pub const LEGACY: Stream = Stream(std::ptr::null_mut());

    /// A stream from its raw handle. Launches check nothing about it: the `unsafe` entry points
    /// require a live stream of the context their buffers belong to.
    pub fn from_raw(handle: *mut c_void) -> Self {
        Self(handle)
    }

    /// A stream from its handle as an integer (what Python's `cuda_stream` gives).
    pub fn from_addr(handle: usize) -> Self {
        Self(handle as *mut c_void)
    }

    /// The raw handle.
    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}
