//! Memory the CUDA backend uses: host memory registered with the driver (pinned, mapped into
//! every context, so copies are asynchronous and streams can wait on flags inside it) and
//! device buffers.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::check;
use crate::Result;

/// A range of host memory (for example a shared-memory segment) page-locked and mapped for
/// every device; unregistered on drop.
pub struct HostRegistration {
    ptr: *mut u8,
    len: usize,
    device_ptr: u64,
}

// SAFETY: the registration is a pointer range plus driver state that may be released from any
// thread; it never reads or writes the memory itself.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` (portable to all contexts, device-mapped).
    ///
    /// # Safety
    /// The range must be mapped, page-aligned and stay mapped until this value is dropped.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<HostRegistration> {
        super::require()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller guarantees the range.
        check(
            unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) },
            "cuMemHostRegister",
        )?;
        let mut device_ptr = 0u64;
        // SAFETY: the range is registered with DEVICEMAP; flags must be 0.
        let got = check(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr.cast(), 0) },
            "cuMemHostGetDevicePointer",
        );
        if let Err(e) = got {
            // SAFETY: undoes the registration above.
            unsafe { sys::cuMemHostUnregister(ptr.cast()) };
            return Err(e);
        }
        Ok(HostRegistration {
            ptr,
            len,
            device_ptr,
        })
    }

    /// Device address of the host byte at `offset` (for stream flag operations).
    pub fn device_addr(&self, offset: usize) -> u64 {
        debug_assert!(offset < self.len);
        self.device_ptr + offset as u64
    }

    /// Host address of the byte at `offset`.
    pub fn host_ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset < self.len);
        self.ptr.wrapping_add(offset)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // SAFETY: registered in `new`.
        unsafe { sys::cuMemHostUnregister(self.ptr.cast::<c_void>()) };
    }
}

/// Device memory allocated in the current context; freed on drop.
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    /// Allocates `len` bytes (at least one).
    pub fn new(len: usize) -> Result<DeviceBuffer> {
        super::require()?;
        let mut ptr = 0u64;
        // SAFETY: plain out-parameter call.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) },
            "cuMemAlloc",
        )?;
        Ok(DeviceBuffer { ptr, len })
    }

    /// Device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; the caller ensures no stream still uses it.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}
