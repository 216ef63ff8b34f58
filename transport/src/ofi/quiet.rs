//! The clear-to-send entries of eager receives, kept back until they could matter.
//!
//! An eager receive posts a clear-to-send that names no memory: it only tells a peer that
//! sends the message as a large one (the rendezvous protocol, which waits for the entry) that
//! the lengths differ. When the peer sends eagerly, as it does whenever both sides agree on
//! the length, the message arrives without the entry ever being read. So the entries of one
//! peer wait here ([`Quiet`]) instead of riding on the next message to it: an arriving eager
//! message drops its own entry unsent, and the entries still waiting leave once the oldest
//! receive has waited [`crate::hold::HOLD`] or the engine is about to sleep
//! ([`super::state::State::flush`]). A mismatched sender then learns of the mismatch that much
//! later; a matched exchange saves the entry's bytes and its encoding, decoding and delivery
//! on both sides, per message (docs/TUNING.md, "Fixed constants", has the measurement).

use std::collections::VecDeque;

use crate::device::CtsEntry;
use crate::hold::Held;

/// One peer's eager clear-to-send entries not sent yet, oldest first (receives are posted,
/// and their messages arrive, in sequence order).
#[derive(Default)]
pub struct Quiet {
    entries: VecDeque<CtsEntry>,
    /// Since when the oldest entry waits (restarted when it goes: the next one has waited at
    /// least that long, so it leaves no earlier than [`crate::hold::HOLD`] after it was
    /// posted).
    held: Held,
}

impl Quiet {
    /// Keeps the entry of an eager receive whose message has not arrived.
    pub fn push(&mut self, entry: CtsEntry) {
        if self.entries.is_empty() {
            self.held.note();
        }
        self.entries.push_back(entry);
    }

    /// Eager message `idx` (the slot's next where none) arrived in slot `key`: its receive's
    /// entry need not go.
    pub fn arrived(&mut self, key: u32, idx: Option<u32>) {
        let Some(at) = self
            .entries
            .iter()
            .position(|e| e.key == key && idx.is_none_or(|i| e.idx == i))
        else {
            return;
        };
        self.entries.remove(at);
        if at == 0 {
            self.held.clear();
            if !self.entries.is_empty() {
                self.held.note();
            }
        }
    }

    /// The entries to send now: all of them with `all`, or once the oldest has waited
    /// [`crate::hold::HOLD`]; none otherwise.
    pub fn due(&mut self, all: bool) -> Vec<CtsEntry> {
        if self.entries.is_empty() || !(all || self.held.due()) {
            return Vec::new();
        }
        self.held.clear();
        self.entries.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: u32, idx: u32) -> CtsEntry {
        CtsEntry {
            key,
            idx,
            ..CtsEntry::default()
        }
    }

    /// An arriving message drops only its own receive's entry (slot and index both match);
    /// the others leave together when asked for all.
    #[test]
    fn arrivals_drop_their_own_entry_only() {
        let mut q = Quiet::default();
        q.push(entry(0, 1));
        q.push(entry(1, 2));
        q.push(entry(2, 3));
        q.arrived(1, Some(2));
        q.arrived(2, Some(7)); // an index of another round through the slots
        assert!(q.due(false).is_empty(), "nothing has waited yet");
        let keys: Vec<_> = q.due(true).iter().map(|e| (e.key, e.idx)).collect();
        assert_eq!(keys, [(0, 1), (2, 3)]);
        assert!(q.due(true).is_empty(), "sent once");
    }

    /// A compact eager message (no index: the slot's next) drops its slot's entry.
    #[test]
    fn a_compact_arrival_drops_its_slots_entry() {
        let mut q = Quiet::default();
        q.push(entry(0, 1));
        q.push(entry(3, 4));
        q.arrived(3, None);
        let keys: Vec<_> = q.due(true).iter().map(|e| (e.key, e.idx)).collect();
        assert_eq!(keys, [(0, 1)]);
    }

    /// Entries whose receive waits leave on their own once the oldest has waited the hold
    /// time, even while the engine never sleeps.
    #[test]
    fn waiting_entries_leave_after_the_hold() {
        let mut q = Quiet::default();
        q.push(entry(0, 1));
        std::thread::sleep(std::time::Duration::from_micros(
            crate::hold::HOLD.get() + 1000,
        ));
        let due = (0..64).map(|_| q.due(false)).find(|d| !d.is_empty());
        assert_eq!(due.map(|d| d.len()), Some(1));
    }
}
