//! [`SharedBuf`]: typed buffers in shared user memory, which the other ranks of the host reach
//! with plain copies (`ncclMemAlloc`'s role for shared memory).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use ampccl_runtime::{Element, Result};
use ampccl_transport::shm::SharedMem;

use super::nonblocking::StableBuf;

/// `len` elements of `T` in memory that the other processes of this host map
/// ([`SharedMem`]). Use it as a slice (it derefs to `[T]`) or pass it to the asynchronous
/// calls (it is a [`StableBuf`]).
///
/// Any buffer works with any call; one in shared memory saves copies. A peer writes into it or
/// reads from it directly where an algorithm lets it (the 2-rank broadcast, allgather and
/// allreduce), instead of going through the communicator's window and a copy on this rank.
/// Each rank decides from its own buffers, so ranks may mix shared and ordinary buffers.
pub struct SharedBuf<T: Element> {
    mem: SharedMem,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Element> SharedBuf<T> {
    /// `len` zero elements (every [`Element`] is valid as all zero bits).
    pub fn zeroed(len: usize) -> Result<SharedBuf<T>> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            ampccl_runtime::Error::InvalidArgument(format!("{len} elements overflow"))
        })?;
        Ok(SharedBuf {
            mem: SharedMem::new(bytes)?,
            len,
            _elem: PhantomData,
        })
    }

    /// `len` elements `f(0), f(1), …`.
    pub fn from_fn(len: usize, mut f: impl FnMut(usize) -> T) -> Result<SharedBuf<T>> {
        let mut b = SharedBuf::zeroed(len)?;
        for (i, x) in b.iter_mut().enumerate() {
            *x = f(i);
        }
        Ok(b)
    }
}

impl<T: Element> Deref for SharedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the allocation holds `len` initialised elements (zeroed, then written only
        // as `T`), page-aligned, owned by `self` for the borrow's lifetime.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> std::fmt::Debug for SharedBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuf")
            .field("mem", &self.mem)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the mapping does not move when the `SharedBuf` moves.
unsafe impl<T: Element> StableBuf for SharedBuf<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.len
    }
    fn as_mut_ptr(&mut self) -> *mut T {
        self.mem.as_ptr().cast()
    }
}
