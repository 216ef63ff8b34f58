//! Doorbell: the one word a progress driver sleeps on.
//!
//! Anything that may unblock work of an engine (a local enqueue, a peer's write into our
//! shared memory, a notify record, an abort) rings the engine's doorbell. A driver that found
//! nothing to do reads [`Doorbell::seq`] *before* polling, and sleeps with that value, so a ring
//! between its poll and its sleep is never lost. Ringing costs one atomic add plus, only when
//! someone sleeps, one `futex` wake; the words may live in shared memory so peers in other
//! processes can ring.

use std::time::Duration;

#[cfg(all(test, ampccl_loom))]
use crate::sync::Arc;
use crate::sync::{AtomicU32, Ordering};

/// The words of a doorbell, `#[repr(C)]` so they can be placed in shared memory.
#[repr(C)]
#[derive(Default)]
pub struct DoorbellWords {
    seq: AtomicU32,
    sleepers: AtomicU32,
    /// Loom only: counts wake calls, modelling the futex's wait queue.
    #[cfg(ampccl_loom)]
    wakes: AtomicU32,
}

/// Keeps the memory behind a shared-memory handle mapped (a plain `std` Arc even under loom:
/// it only owns memory, it synchronizes nothing).
pub type Keepalive = std::sync::Arc<dyn Send + Sync>;

/// Handle to a doorbell (heap or shared memory). Cheap to clone.
#[derive(Clone)]
pub struct Doorbell {
    words: *const DoorbellWords,
    _keep: Keepalive,
}

// SAFETY: the pointee is only accessed through atomics and `_keep` keeps it alive.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl Default for Doorbell {
    fn default() -> Self {
        Doorbell::new()
    }
}

impl Doorbell {
    /// A doorbell in process memory.
    pub fn new() -> Doorbell {
        let words = std::sync::Arc::new(DoorbellWords::default());
        let ptr: *const DoorbellWords = &*words;
        Doorbell {
            words: ptr,
            _keep: words,
        }
    }

    /// A doorbell over words in shared memory.
    ///
    /// # Safety
    /// `words` must point to a `DoorbellWords` (zero-initialised or used only as one) that stays
    /// mapped as long as `keep` lives.
    #[cfg(not(ampccl_loom))]
    pub unsafe fn from_shared(words: *const DoorbellWords, keep: Keepalive) -> Doorbell {
        Doorbell { words, _keep: keep }
    }

    fn words(&self) -> &DoorbellWords {
        // SAFETY: valid while `_keep` lives, which `self` holds.
        unsafe { &*self.words }
    }

    /// Current ring count; read it before polling for work, pass it to [`Doorbell::sleep`].
    #[inline]
    pub fn seq(&self) -> u32 {
        self.words().seq.load(Ordering::SeqCst)
    }

    /// Rings: wakes sleepers (if any) and makes any later `sleep(seen)` with an older `seen`
    /// return at once.
    #[inline]
    pub fn ring(&self) {
        let w = self.words();
        w.seq.fetch_add(1, Ordering::SeqCst);
        if w.sleepers.load(Ordering::SeqCst) != 0 {
            self.wake();
        }
    }

    /// Sleeps until a ring newer than `seen`, or `timeout`. May return spuriously.
    pub fn sleep(&self, seen: u32, timeout: Duration) {
        let w = self.words();
        w.sleepers.fetch_add(1, Ordering::SeqCst);
        // A read-modify-write, not a load: it is ordered with the ringer's increment in `seq`'s
        // modification order, so either we see the ring, or the ringer's `sleepers` load sees
        // our increment (Dekker's pattern without relying on SeqCst loads, which loom does not
        // model).
        if w.seq.fetch_add(0, Ordering::SeqCst) == seen {
            self.block(seen, timeout);
        }
        w.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    #[cfg(not(ampccl_loom))]
    fn wake(&self) {
        crate::futex::wake_all(&self.words().seq);
    }

    #[cfg(not(ampccl_loom))]
    fn block(&self, seen: u32, timeout: Duration) {
        crate::futex::wait(&self.words().seq, seen, timeout);
    }

    // Loom model of the futex: a blocked thread stays blocked until a wake that happens after
    // it started waiting (a lost wake-up makes the model spin forever, which loom reports).
    #[cfg(ampccl_loom)]
    fn wake(&self) {
        self.words().wakes.fetch_add(1, Ordering::SeqCst);
    }

    #[cfg(ampccl_loom)]
    fn block(&self, seen: u32, _timeout: Duration) {
        let w = self.words();
        let wakes = w.wakes.load(Ordering::SeqCst);
        if w.seq.fetch_add(0, Ordering::SeqCst) != seen {
            return;
        }
        while w.wakes.load(Ordering::SeqCst) == wakes {
            loom::thread::yield_now();
        }
    }
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use super::*;

    /// A sleeper that read `seen` before the ring must not miss it.
    #[test]
    fn ring_is_never_lost() {
        loom::model(|| {
            let bell = Doorbell::new();
            let flag = Arc::new(AtomicU32::new(0));
            let (b2, f2) = (bell.clone(), flag.clone());
            let ringer = loom::thread::spawn(move || {
                f2.store(1, Ordering::SeqCst);
                b2.ring();
            });
            loop {
                let seen = bell.seq();
                if flag.load(Ordering::SeqCst) == 1 {
                    break;
                }
                bell.sleep(seen, Duration::from_secs(1));
            }
            ringer.join().unwrap();
        });
    }
}

#[cfg(all(test, not(ampccl_loom)))]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn sleep_returns_on_ring_from_another_thread() {
        let bell = Doorbell::new();
        let seen = bell.seq();
        let b2 = bell.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b2.ring();
        });
        let start = Instant::now();
        while bell.seq() == seen {
            bell.sleep(seen, Duration::from_secs(5));
        }
        assert!(start.elapsed() < Duration::from_secs(4));
        t.join().unwrap();
    }

    #[test]
    fn stale_seen_returns_immediately() {
        let bell = Doorbell::new();
        let seen = bell.seq();
        bell.ring();
        let start = Instant::now();
        bell.sleep(seen, Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
