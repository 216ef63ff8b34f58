//! How long the network providers hold small frames back.
//!
//! Frames nobody waits for in the common case — credits (a sender needs one only a FIFO's
//! depth of messages later) and the clear-to-send entries of eager receives (which only expose
//! a length mismatch) — are *held*: they leave in front of the next message to their peer, in
//! the same system call. When no such message comes, the engine's idle steps send them
//! ([`crate::transport::Transport::flush`]) once the oldest has waited [`HOLD`], and the
//! driver sends all of them before it sleeps ([`crate::transport::Transport::driver_sleeps`]).
//! The `ofi` provider holds an eager receive's clear-to-send longer still: it rides on no
//! message, leaves only once the receive has waited [`HOLD`] (or before the driver sleeps),
//! and not at all when the message arrives first (`ofi::quiet`). Its credits wait for a
//! count instead of a clock (`ofi::outgoing`), since its compact messages carry no batch.
//!
//! Sending them at the first idle step instead costs a small exchange a second message each
//! way: the credit of message `n` leaves alone while the engine waits for message `n + 1`,
//! instead of riding on the reply. Over sockets that is one `sendmsg` and one receive more
//! per message on each side.

use std::time::{Duration, Instant};

use ampccl_runtime::param::{Param, Unit};

/// `AMPCCL_HOLD_US`: how long a held frame waits for a message to ride on while the engine
/// idles.
pub static HOLD: Param = Param::new(
    "HOLD_US",
    50,
    (0, 100_000),
    Unit::Micros,
    "how long credits and other small frames nobody waits for yet wait for a message to ride \
     on while the engine idles",
);

/// Idle steps per clock reading of [`Held::due`]: an idle step of a spinning engine costs
/// about as much as reading the clock.
const CHECK_EVERY: u32 = 8;

/// Since when a peer's oldest held frame has waited.
#[derive(Debug, Default)]
pub struct Held {
    since: Option<Instant>,
    /// Calls of [`Held::due`] since it last read the clock.
    checks: u32,
}

impl Held {
    /// A frame was held (the first since the last send starts the clock).
    pub fn note(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// The held frames left.
    pub fn clear(&mut self) {
        self.since = None;
    }

    /// Whether the oldest held frame has waited [`HOLD`] (false when none is held); reads
    /// the clock on every [`CHECK_EVERY`]th call only, so it says so up to that many idle
    /// steps late.
    pub fn due(&mut self) -> bool {
        let Some(t) = self.since else { return false };
        self.checks += 1;
        if self.checks < CHECK_EVERY {
            return false;
        }
        self.checks = 0;
        t.elapsed() >= Duration::from_micros(HOLD.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `h` says it is due within one round of clock readings.
    fn due_soon(h: &mut Held) -> bool {
        (0..CHECK_EVERY).any(|_| h.due())
    }

    #[test]
    fn nothing_held_is_never_due() {
        assert!(!due_soon(&mut Held::default()));
    }

    #[test]
    fn the_clock_starts_at_the_first_held_frame() {
        let mut h = Held::default();
        h.note();
        let first = h.since;
        std::thread::sleep(Duration::from_millis(1));
        h.note();
        assert_eq!(h.since, first, "a later frame keeps the oldest's time");
        std::thread::sleep(Duration::from_micros(HOLD.get()));
        assert!(due_soon(&mut h));
        h.clear();
        assert!(!due_soon(&mut h));
    }
}
