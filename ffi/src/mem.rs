//! `ampcclMemAlloc` / `ampcclMemFree` (NCCL's `ncclMemAlloc` / `ncclMemFree`): host memory that
//! the other ranks of the host map ([`SharedMem`]), so that collectives on it save copies.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use ampccl_native::SharedMem;

use crate::error::{guard, invalid};
use crate::types::ampcclResult_t::{self, *};

/// The live allocations by address.
static ALLOCS: Mutex<BTreeMap<usize, SharedMem>> = Mutex::new(BTreeMap::new());

/// `*ptr` = `size` zero bytes of shared user memory (page-aligned). Any buffer works with any
/// call; buffers from here let peers write and read them directly (the 2-rank broadcast,
/// allgather and allreduce) instead of through the communicator's window. Free with
/// `ampcclMemFree`.
///
/// # Safety
/// `ptr` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ampcclResult_t {
    guard("ampcclMemAlloc", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr.as_mut() }.ok_or_else(|| invalid("ptr is NULL"))?;
        if size == 0 {
            return Err(invalid("size is 0"));
        }
        let mem = SharedMem::new(size)?;
        let p = mem.as_ptr();
        ALLOCS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize, mem);
        *out = p.cast();
        Ok(ampcclSuccess)
    })
}

/// Frees memory from `ampcclMemAlloc` (NULL: nothing to do). No operation may still use it.
///
/// # Safety
/// `ptr` is NULL or was returned by `ampcclMemAlloc` and not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclMemFree(ptr: *mut c_void) -> ampcclResult_t {
    guard("ampcclMemFree", || {
        if ptr.is_null() {
            return Ok(ampcclSuccess);
        }
        let mem = ALLOCS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr as usize))
            .ok_or_else(|| invalid(format!("{ptr:p} was not allocated by ampcclMemAlloc")))?;
        drop(mem);
        Ok(ampcclSuccess)
    })
}
