//! Host memory types: owned aligned buffers and borrowed regions.
//!
//! - [`HostBuffer`]: zero-initialised heap memory aligned to a cache line (64 B), for scratch
//!   and staging — alignment keeps reduction kernels on their fast path and avoids false
//!   sharing with neighbours.
//! - [`Region`]: a `(pointer, length)` view of memory owned elsewhere (a user buffer, a
//!   registered window in shared memory) as tasks address it.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of every [`HostBuffer`].
pub const ALIGN: usize = 64;

/// Owned, zeroed, 64-byte-aligned host memory.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its memory exclusively; access through the raw pointer is
// synchronised by whoever shares it (stream order).
unsafe impl Send for HostBuffer {}
// SAFETY: `&HostBuffer` only hands out the pointer and length.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` zero bytes (no allocation for `len == 0`).
    pub fn zeroed(len: usize) -> HostBuffer {
        if len == 0 {
            // An aligned address that is never dereferenced: nothing to allocate.
            let ptr = NonNull::new(std::ptr::without_provenance_mut(ALIGN)).expect("non-zero");
            return HostBuffer { ptr, len };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        HostBuffer { ptr, len }
    }

    /// Start of the buffer (aligned to [`ALIGN`]).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer as a region.
    pub fn region(&self) -> Region {
        Region {
            ptr: self.as_ptr(),
            len: self.len,
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, ALIGN),
                )
            };
        }
    }
}

/// Memory owned elsewhere, as tasks address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Region {
    /// No memory.
    pub const EMPTY: Region = Region {
        ptr: std::ptr::null_mut(),
        len: 0,
    };

    /// Pointer to `[off, off + len)` inside the region, `None` when out of bounds.
    pub fn at(&self, off: usize, len: usize) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        (end <= self.len).then(|| self.ptr.wrapping_add(off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_bounds_checked() {
        for len in [0usize, 1, 63, 4096, 1 << 20] {
            let b = HostBuffer::zeroed(len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            // SAFETY: the buffer holds `len` initialised bytes.
            let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), len) };
            assert!(bytes.iter().all(|&x| x == 0));
            let r = b.region();
            assert!(r.at(0, len).is_some());
            assert!(r.at(len, 0).is_some());
            assert!(r.at(len, 1).is_none());
            assert!(r.at(usize::MAX, 2).is_none());
        }
    }
}
