//! Synchronization shim: std atomics normally, loom's under `--cfg ampccl_loom`.
//!
//! Every synchronization primitive of ampccl imports its atomics, mutexes and threads from here,
//! so the loom models exercise the real code (tokio's `src/loom` pattern).

#[cfg(not(ampccl_loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(ampccl_loom))]
pub use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(ampccl_loom))]
pub use std::thread;

#[cfg(ampccl_loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(ampccl_loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(ampccl_loom)]
pub use loom::thread;

/// Hint used inside spin loops (a loom yield under the model checker).
#[inline]
pub fn spin_hint() {
    #[cfg(not(ampccl_loom))]
    std::hint::spin_loop();
    #[cfg(ampccl_loom)]
    loom::thread::yield_now();
}

/// An `UnsafeCell` with loom's access API (`with`, `with_mut`), so the model checker sees every
/// access of data handed between threads.
#[cfg(not(ampccl_loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(ampccl_loom))]
impl<T> UnsafeCell<T> {
    pub fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a pointer for reading the value.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a pointer for writing the value.
    #[inline]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(ampccl_loom)]
pub use loom::cell::UnsafeCell;
