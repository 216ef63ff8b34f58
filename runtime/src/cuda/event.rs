//! CUDA events: the points in a stream that other streams wait on (joins) and that time the
//! two paths of a split collective without a host synchronisation ([`CudaEvent::query`] and
//! [`CudaEvent::elapsed_ms`] are read lazily, when the work is long done).

use cudarc::driver::sys;

use super::check;
use crate::Result;

/// An event created in the current context; destroyed on drop.
pub struct CudaEvent {
    raw: sys::CUevent,
}

// SAFETY: event handles may be used from any thread; the driver serialises access.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// Creates an event; `timing` events can be measured, the others are cheaper to wait on.
    pub fn new(timing: bool) -> Result<CudaEvent> {
        super::require()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT as u32
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: plain out-parameter call.
        check(
            unsafe { sys::cuEventCreate(&mut raw, flags) },
            "cuEventCreate",
        )?;
        Ok(CudaEvent { raw })
    }

    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Whether all work before the last recording has completed (never blocks).
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the handle is live.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => check(e, "cuEventQuery").map(|()| false),
        }
    }

    /// Blocks until the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }

    /// Milliseconds between two completed timing events.
    pub fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both handles are live.
        check(
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, end.raw) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by `new`; destroying a pending event is allowed (driver rule).
        unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}
