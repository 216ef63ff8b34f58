//! Process-shared futex wait/wake on a 32-bit word (the word may live in shared memory).
//!
//! Shared (not `FUTEX_PRIVATE`) futexes, so a word in a shared-memory segment wakes a thread of
//! another process. Under `--cfg ampccl_loom` the doorbell models the futex itself (see
//! [`crate::doorbell`]), so this module only exists for real builds.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// Blocks while `*word == expected`, at most `timeout`. Returns early on a wake, a changed
/// value, a signal or a spurious wake-up; callers re-check their condition.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = futex::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // Errors (EAGAIN: value changed, ETIMEDOUT, EINTR) all mean "re-check"; nothing to report.
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every thread (of any process) blocked in [`wait`] on `word`.
pub fn wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}
