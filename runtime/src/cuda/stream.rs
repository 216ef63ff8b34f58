//! CUDA streams: [`CudaStream`] owns one, [`StreamRef`] names any (also one the application
//! created) and carries the operations the runtime's vocabulary maps to.
//!
//! | runtime vocabulary | CUDA stream operation |
//! |---|---|
//! | copy | `cuMemcpy{DtoH,HtoD,DtoD}Async` |
//! | notify record | `cuStreamWriteValue32` on a host-mapped flag |
//! | notify wait | `cuStreamWaitValue32(GEQ)` on a host-mapped flag |
//! | event record / wait | `cuEventRecord` / `cuStreamWaitEvent` |
//! | reduce | an NVRTC kernel ([`super::ReduceKernels`]) |
//!
//! Every operation is asynchronous; the caller keeps the memory it names alive and unchanged
//! until the stream has passed the operation.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::{CudaEvent, check};
use crate::Result;

/// A borrowed CUDA stream handle (the null handle is the legacy default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRef(pub sys::CUstream);

// SAFETY: stream handles may be used from any thread; the driver serialises access.
unsafe impl Send for StreamRef {}
// SAFETY: as above.
unsafe impl Sync for StreamRef {}

impl StreamRef {
    /// Wraps a raw `CUstream` / `cudaStream_t`.
    pub fn from_raw(raw: *mut c_void) -> StreamRef {
        StreamRef(raw.cast())
    }

    /// Whether the stream is being captured into a CUDA graph (work must then not be added
    /// behind the capture's back).
    pub fn is_capturing(self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: plain out-parameter query on a stream handle of the current context.
        check(
            unsafe { sys::cuStreamIsCapturing(self.0, &mut status) },
            "cuStreamIsCapturing",
        )?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Copies `bytes` from device memory to host memory.
    ///
    /// # Safety
    /// `src` must be device memory and `dst` host memory (pinned for asynchrony) of at least
    /// `bytes`, both valid until the stream passes the copy.
    pub unsafe fn copy_dtoh(self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees the ranges.
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, self.0) },
            "cuMemcpyDtoHAsync",
        )
    }

    /// Copies `bytes` from host memory to device memory.
    ///
    /// # Safety
    /// As [`StreamRef::copy_dtoh`], directions swapped.
    pub unsafe fn copy_htod(self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees the ranges.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, self.0) },
            "cuMemcpyHtoDAsync",
        )
    }

    /// Copies `bytes` between device buffers.
    ///
    /// # Safety
    /// Both ranges must be device memory valid until the stream passes the copy.
    pub unsafe fn copy_dtod(self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees the ranges.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.0) },
            "cuMemcpyDtoDAsync",
        )
    }

    /// Notify record: writes `value` to the flag at device address `flag` once all earlier work
    /// of the stream is done (with a memory barrier, so that earlier copies are visible first).
    ///
    /// # Safety
    /// `flag` must be a device-mapped address of a 4-byte aligned word that stays mapped.
    pub unsafe fn write_flag(self, flag: u64, value: u32) -> Result<()> {
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the caller guarantees the address.
        check(
            unsafe { sys::cuStreamWriteValue32_v2(self.0, flag, value, flags) },
            "cuStreamWriteValue32",
        )
    }

    /// Notify wait: later work of the stream starts only once the flag at `flag` is `>= value`
    /// (compared as unsigned 32-bit numbers).
    ///
    /// # Safety
    /// As [`StreamRef::write_flag`].
    pub unsafe fn wait_flag(self, flag: u64, value: u32) -> Result<()> {
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: the caller guarantees the address.
        check(
            unsafe { sys::cuStreamWaitValue32_v2(self.0, flag, value, flags) },
            "cuStreamWaitValue32",
        )
    }

    /// Records `event` at the current end of the stream.
    pub fn record(self, event: &CudaEvent) -> Result<()> {
        // SAFETY: both handles are live.
        check(
            unsafe { sys::cuEventRecord(event.raw(), self.0) },
            "cuEventRecord",
        )
    }

    /// Makes later work of the stream wait for the last recording of `event`.
    pub fn wait_event(self, event: &CudaEvent) -> Result<()> {
        // SAFETY: both handles are live; flags must be 0.
        check(
            unsafe { sys::cuStreamWaitEvent(self.0, event.raw(), 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Blocks until the stream is idle (tests and tools; the library never syncs a stream).
    pub fn synchronize(self) -> Result<()> {
        // SAFETY: the handle is live.
        check(
            unsafe { sys::cuStreamSynchronize(self.0) },
            "cuStreamSynchronize",
        )
    }
}

/// A stream this library created (non-blocking: it does not synchronise with the legacy
/// default stream); destroyed on drop.
pub struct CudaStream {
    raw: StreamRef,
}

impl CudaStream {
    /// Creates a stream in the current context.
    pub fn new() -> Result<CudaStream> {
        super::require()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: plain out-parameter call.
        check(
            unsafe { sys::cuStreamCreate(&mut raw, flags) },
            "cuStreamCreate",
        )?;
        Ok(CudaStream {
            raw: StreamRef(raw),
        })
    }

    /// The handle, for enqueuing work.
    pub fn handle(&self) -> StreamRef {
        self.raw
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `new`; pending work still completes (driver rule).
        unsafe { sys::cuStreamDestroy_v2(self.raw.0) };
    }
}
