//! How an engine's driver and a provider's background thread share the reading of what
//! arrives. While the engine polls a peer (TCP) or an endpoint (`ofi`), it applies arrivals
//! itself, and the thread leaves them alone: a thread woken for every message takes a core from
//! the engine on a small host, and the two then contend for the same lock. The engine marks
//! each poll ([`PollMark::mark`]); the thread treats a mark younger than [`ENGINE_GRACE`] as
//! "the engine is on it". Right before the driver sleeps it clears its marks
//! ([`PollMark::stop`]) and gives the [`Handback`], an `eventfd` in the thread's wait set, so
//! the thread watches again at once and rings the doorbell the driver sleeps on for whatever
//! arrives after the driver's last look.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long after the engine's last poll the background thread still leaves arrivals to the
/// engine, unless the engine said it stopped ([`PollMark::stop`]).
pub const ENGINE_GRACE: Duration = Duration::from_micros(200);

/// Polls per clock reading: a poll marks the time only every so often (a clock read costs
/// about as much as an `ofi` poll's own work), so a mark is at most this many polls old —
/// microseconds, against [`ENGINE_GRACE`].
const MARK_EVERY: u32 = 16;

/// When the engine last polled something (a peer, an endpoint).
pub struct PollMark {
    /// Nanoseconds since `epoch` of the last poll; 0: not polled since the last stop.
    at: AtomicU64,
    /// Polls left before the next one reads the clock.
    skips: AtomicU32,
    epoch: Instant,
}

impl Default for PollMark {
    fn default() -> PollMark {
        PollMark {
            at: AtomicU64::new(0),
            skips: AtomicU32::new(0),
            epoch: Instant::now(),
        }
    }
}

impl PollMark {
    /// Records that the engine polls now (the first poll after a stop, and every
    /// [`MARK_EVERY`]th, with the time; lost updates between racing engine threads only make
    /// a mark a few polls older or fresher).
    pub fn mark(&self) {
        let left = self.skips.load(Ordering::Relaxed);
        if left > 0 && self.at.load(Ordering::Relaxed) != 0 {
            self.skips.store(left - 1, Ordering::Relaxed);
            return;
        }
        self.skips.store(MARK_EVERY - 1, Ordering::Relaxed);
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.at.store(now.max(1), Ordering::Release);
    }

    /// Records that the engine stopped polling (its driver goes to sleep); true if it had
    /// polled since the last call.
    pub fn stop(&self) -> bool {
        self.at.swap(0, Ordering::AcqRel) != 0
    }

    /// Marks polled until [`PollMark::stop`], however long that takes (tests).
    #[cfg(test)]
    pub fn hold(&self) {
        self.at.store(u64::MAX, Ordering::Release);
    }

    /// Whether the engine polled less than [`ENGINE_GRACE`] ago and has not stopped.
    pub fn recent(&self) -> bool {
        let at = self.at.load(Ordering::Acquire);
        at != 0
            && (self.epoch.elapsed().as_nanos() as u64).saturating_sub(at)
                < ENGINE_GRACE.as_nanos() as u64
    }
}

/// The word an engine's driver sends the background thread right before it sleeps: an
/// `eventfd` the thread waits on together with its sockets or completion queue.
pub struct Handback(OwnedFd);

impl Handback {
    pub fn new() -> std::io::Result<Handback> {
        // SAFETY: plain system call; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        Ok(Handback(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor that becomes readable when the word was given.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Wakes the thread (the caller cleared its poll marks first).
    pub fn give(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write to our eventfd; a full counter (EAGAIN) still wakes.
        unsafe { libc::write(self.fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the counter.
    pub fn take(&self) {
        let mut v = [0u8; 8];
        // SAFETY: an 8-byte read from our non-blocking eventfd into `v`.
        unsafe { libc::read(self.fd(), v.as_mut_ptr().cast(), v.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_age_and_stop() {
        let m = PollMark::default();
        assert!(!m.recent() && !m.stop());
        m.mark();
        assert!(m.recent());
        std::thread::sleep(ENGINE_GRACE * 2);
        assert!(
            !m.recent(),
            "a mark older than the grace counts as not polling"
        );
        assert!(m.stop(), "polled since the last stop");
        assert!(!m.stop());
        m.hold();
        std::thread::sleep(ENGINE_GRACE * 2);
        assert!(m.recent());
    }

    #[test]
    fn a_mark_reads_the_clock_every_few_polls_and_after_a_stop() {
        let m = PollMark::default();
        m.mark();
        std::thread::sleep(ENGINE_GRACE * 2);
        m.mark();
        assert!(!m.recent(), "the second poll does not read the clock");
        for _ in 0..MARK_EVERY {
            m.mark();
        }
        assert!(m.recent(), "one of the next polls does");
        assert!(m.stop());
        m.mark();
        assert!(m.recent(), "the first poll after a stop does");
    }

    #[test]
    fn the_word_wakes_a_poll_once() {
        let h = Handback::new().unwrap();
        let ready = |h: &Handback| {
            let mut p = libc::pollfd {
                fd: h.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, no wait.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!ready(&h));
        h.give();
        h.give();
        assert!(ready(&h));
        h.take();
        assert!(!ready(&h));
    }
}
