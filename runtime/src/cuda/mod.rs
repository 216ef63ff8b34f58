//! CUDA backend of the runtime (feature `cuda`): the same vocabulary as the host runtime —
//! streams, events, notifies (flags in host-mapped memory that streams write and wait on),
//! copies and reductions — expressed as CUDA stream operations.
//!
//! Nothing CUDA is linked at build time: the driver (`libcuda.so.1`) and NVRTC
//! (`libnvrtc.so.*`) are opened at run time through `cudarc`'s dynamic loading. `cudarc` panics
//! when a library is missing, so every entry point here first checks [`available`], which looks
//! for the library without panicking; a machine without CUDA gets an error, never a panic.
//!
//! All calls work on the *primary context* of a device, the one the CUDA runtime (and thus
//! PyTorch or any `cudart` program) uses, so raw `CUstream`s of the application can be used
//! directly. [`Device::enter`] makes that context current for a scope.

mod event;
mod kernels;
mod memory;
mod stream;

use std::ffi::{CStr, c_int};
use std::sync::OnceLock;

use cudarc::driver::sys;

pub use event::CudaEvent;
pub use kernels::{MAX_SOURCES, ReduceKernels};
pub use memory::{DeviceBuffer, HostRegistration};
pub use stream::{CudaStream, StreamRef};

use crate::{Error, Result};

/// Whether the CUDA driver can be used in this process: `libcuda.so.1` is present and `cuInit`
/// succeeds. The answer is computed once.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to open the library; it does not panic.
        if !unsafe { sys::is_culib_present() } {
            return false;
        }
        // SAFETY: the library is present, so the lazily loaded `cuInit` resolves; flags must be 0.
        unsafe { sys::cuInit(0) == sys::CUresult::CUDA_SUCCESS }
    })
}

/// Fails with a clear error when CUDA cannot be used.
fn require() -> Result<()> {
    if available() {
        Ok(())
    } else {
        Err(Error::System(
            "the CUDA driver (libcuda.so.1) is not available".into(),
        ))
    }
}

/// Turns a driver result into an error naming the call.
pub(crate) fn check(res: sys::CUresult, what: &str) -> Result<()> {
    if res == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `cuGetErrorName` writes a pointer to a static string (or leaves it null).
    let named = unsafe { sys::cuGetErrorName(res, &mut name) } == sys::CUresult::CUDA_SUCCESS;
    let text = if named && !name.is_null() {
        // SAFETY: a non-null pointer from `cuGetErrorName` is a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{res:?}")
    };
    Err(Error::System(format!("{what}: {text}")))
}

/// One GPU, through its primary context (shared with the CUDA runtime of the application).
pub struct Device {
    ordinal: c_int,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (it is made current per thread by
// `enter`); the primary context stays alive until `drop` releases this handle's reference.
unsafe impl Send for Device {}
// SAFETY: as above; `&Device` only offers `enter`, which is thread-safe in the driver.
unsafe impl Sync for Device {}

impl Device {
    /// Retains the primary context of device `ordinal`.
    pub fn new(ordinal: i32) -> Result<Device> {
        require()?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: plain out-parameter call on an initialised driver.
        check(
            unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
            "cuDeviceGet",
        )?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: plain out-parameter call; the reference is released in `drop`.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(Device { ordinal: dev, ctx })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes this device's primary context current on the calling thread until the guard drops
    /// (the previous context is restored then).
    pub fn enter(&self) -> Result<ContextGuard> {
        // SAFETY: `ctx` is a retained, live context.
        check(
            unsafe { sys::cuCtxPushCurrent_v2(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        Ok(ContextGuard {
            _not_send: std::marker::PhantomData,
        })
    }

    /// A device attribute.
    pub fn attribute(&self, attr: sys::CUdevice_attribute) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: plain out-parameter call.
        check(
            unsafe { sys::cuDeviceGetAttribute(&mut v, attr, self.ordinal) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    /// Compute capability as `major * 10 + minor`.
    pub fn compute_capability(&self) -> Result<i32> {
        use sys::CUdevice_attribute::*;
        Ok(
            self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? * 10
                + self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        )
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken in `new`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.ordinal) };
    }
}

/// A device context made current by [`Device::enter`]; restores the previous one on drop.
/// Contexts are per thread, so the guard cannot move to another thread.
pub struct ContextGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed by `Device::enter` on this same thread.
        unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
    }
}
