//! Notify: a generation-counted signal from one stream to another, in-process or across
//! processes (the counter word may live in shared memory).
//!
//! `record` adds one to the counter and rings the waiting side's doorbell. Each `wait` enqueued
//! on the waiting side takes the next generation ([`Notify::next_wait`]) and is satisfied once
//! the counter reaches it, so a notify is reused across operations without any reset and a
//! record that arrives before its wait is never lost.

use crate::doorbell::{Doorbell, Keepalive};
use crate::sync::{Arc, AtomicU32, Ordering};

/// Handle to a notify. Clones share the counter and the wait-generation allocator.
#[derive(Clone)]
pub struct Notify {
    counter: *const AtomicU32,
    /// Next generation a wait on this handle will expect (waiting side only).
    next_wait: Arc<AtomicU32>,
    /// Doorbell of the engine whose streams wait on this notify.
    waiter_bell: Doorbell,
    _keep: Keepalive,
}

// SAFETY: `counter` is only accessed atomically and is kept alive by `_keep`.
unsafe impl Send for Notify {}
// SAFETY: as above.
unsafe impl Sync for Notify {}

impl Notify {
    /// A notify in process memory, waited on by an engine with doorbell `waiter_bell`.
    pub fn new(waiter_bell: Doorbell) -> Notify {
        let counter = std::sync::Arc::new(AtomicU32::new(0));
        let ptr: *const AtomicU32 = &*counter;
        Notify {
            counter: ptr,
            next_wait: Arc::new(AtomicU32::new(0)),
            waiter_bell,
            _keep: counter,
        }
    }

    /// A notify whose counter lives in shared memory.
    ///
    /// # Safety
    /// `counter` must point to a `u32` word used only atomically, mapped while `keep` lives.
    #[cfg(not(ampccl_loom))]
    pub unsafe fn from_shared(
        counter: *const AtomicU32,
        waiter_bell: Doorbell,
        keep: Keepalive,
    ) -> Notify {
        // The waiting side may re-attach after earlier use: start at the current value.
        // SAFETY: valid by the caller's contract.
        let start = unsafe { &*counter }.load(Ordering::Acquire);
        Notify {
            counter,
            next_wait: Arc::new(AtomicU32::new(start)),
            waiter_bell,
            _keep: keep,
        }
    }

    fn counter(&self) -> &AtomicU32 {
        // SAFETY: kept alive by `_keep`.
        unsafe { &*self.counter }
    }

    /// Signals one generation.
    #[inline]
    pub fn record(&self) {
        self.counter().fetch_add(1, Ordering::Release);
        self.waiter_bell.ring();
    }

    /// Allocates the generation the next wait must see (call when the wait is enqueued).
    #[inline]
    pub fn next_wait(&self) -> u32 {
        self.next_wait
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
    }

    /// True once generation `target` has been recorded.
    #[inline]
    pub fn reached(&self, target: u32) -> bool {
        // Wrapping comparison: the counter may wrap after 2^32 records.
        (self.counter().load(Ordering::Acquire).wrapping_sub(target) as i32) >= 0
    }
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use super::*;

    /// Data written before `record` is visible after the matching wait is satisfied, and a
    /// record that races ahead of the wait is not lost (two generations, reused notify).
    #[test]
    fn record_publishes_data_and_is_reusable() {
        loom::model(|| {
            let bell = Doorbell::new();
            let n = Notify::new(bell.clone());
            let data = Arc::new(AtomicU32::new(0));
            let (n2, d2) = (n.clone(), data.clone());
            let g1 = n.next_wait();
            let g2 = n.next_wait();
            let t = loom::thread::spawn(move || {
                d2.store(1, Ordering::Relaxed);
                n2.record();
                d2.store(2, Ordering::Relaxed);
                n2.record();
            });
            loop {
                let seen = bell.seq();
                if n.reached(g1) {
                    break;
                }
                bell.sleep(seen, std::time::Duration::from_secs(1));
            }
            assert!(data.load(Ordering::Relaxed) >= 1);
            loop {
                let seen = bell.seq();
                if n.reached(g2) {
                    break;
                }
                bell.sleep(seen, std::time::Duration::from_secs(1));
            }
            assert_eq!(data.load(Ordering::Relaxed), 2);
            t.join().unwrap();
        });
    }
}

#[cfg(all(test, not(ampccl_loom)))]
mod tests {
    use super::*;

    #[test]
    fn generations_and_wraparound() {
        let n = Notify::new(Doorbell::new());
        let g1 = n.next_wait();
        assert!(!n.reached(g1));
        n.record();
        assert!(n.reached(g1));
        let g2 = n.next_wait();
        assert!(!n.reached(g2));
        // Wrap: a counter near u32::MAX still compares correctly.
        n.counter().store(u32::MAX, Ordering::Relaxed);
        assert!(n.reached(u32::MAX));
        assert!(!n.reached(0));
        n.record();
        assert!(n.reached(0));
    }
}
