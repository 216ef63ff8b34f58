//! Loom model of the PCIe pipeline's flag schedule ([`crate::schedule`]): two
//! ranks, each with a send and a receive "stream" (threads here), a pipeline two slots deep.
//! Two models: three chunks of one round, so that a slot is reused; and two chunks of two
//! rounds, where the second round stages what the rank's own receive stream produced in the
//! first (a local cell per chunk: staging it before it is written is a race loom reports).
//!
//! Staged data lives in loom cells: a receiver reading a slot while its writer stages the next
//! chunk into it is a data race loom reports, and a receiver reading the wrong chunk fails the
//! value check. Flags are a mutex-protected table with a condition variable (a stream's wait
//! blocks rather than spins, which keeps the model finite). Like the GPU's stream memory
//! operations, a flag write publishes (releases) everything staged before it, and a satisfied
//! wait sees it (acquires). A rank reads its peers' pieces only (its own data it takes from its
//! device): the schedule lets its own next chunk be staged while it still reads the current
//! one, and the model confirms that reading its own piece would race.

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Condvar, Mutex};

use crate::schedule::{ChunkFlags, Flag, Step, steps};

const RANKS: usize = 2;
const SLOTS: usize = 2;

struct Area {
    /// `ready[0..RANKS]` then `consumed[0..RANKS]`.
    flags: Mutex<[u32; 2 * RANKS]>,
    changed: Condvar,
    /// `data[slot][writer]`: what the writer staged.
    data: [[UnsafeCell<u64>; RANKS]; SLOTS],
    /// `local[rank][chunk]`: what a rank's first round produced on its device.
    local: [[UnsafeCell<u64>; 3]; RANKS],
    chunks: usize,
    rounds: usize,
}

// SAFETY: the cells are only accessed under the schedule being checked; loom verifies it.
unsafe impl Sync for Area {}

fn index(f: Flag) -> usize {
    match f {
        Flag::Ready(r) => r,
        Flag::Consumed(r) => RANKS + r,
    }
}

impl Area {
    fn new(chunks: usize, rounds: usize) -> Area {
        let cell = || UnsafeCell::new(0);
        Area {
            flags: Mutex::new([0; 2 * RANKS]),
            changed: Condvar::new(),
            data: [[cell(), cell()], [cell(), cell()]],
            local: [[cell(), cell(), cell()], [cell(), cell(), cell()]],
            chunks,
            rounds,
        }
    }

    fn wait(&self, f: Flag, v: u32) {
        let mut flags = self.flags.lock().expect("flags");
        while flags[index(f)] < v {
            flags = self.changed.wait(flags).expect("flags");
        }
    }

    fn signal(&self, (f, v): (Flag, u32)) {
        self.flags.lock().expect("flags")[index(f)] = v;
        self.changed.notify_all();
    }

    fn steps(&self, me: usize) -> impl Iterator<Item = (Step, ChunkFlags)> {
        let slots = SLOTS;
        steps(0, self.chunks, self.rounds)
            .into_iter()
            .map(move |s| {
                let flags = ChunkFlags {
                    g: s.g,
                    me,
                    nranks: RANKS,
                    slots,
                    after: s.after,
                };
                (s, flags)
            })
    }
}

/// What rank `w` stages in its first round of chunk `c`.
fn payload(c: usize, w: usize) -> u64 {
    c as u64 * 10 + w as u64 + 1
}

/// What rank `w`'s first round of chunk `c` produces (and its second round stages).
fn produced(c: usize, w: usize) -> u64 {
    1000 + payload(c, w)
}

fn send(area: &Area, me: usize) {
    for (s, c) in area.steps(me) {
        for (f, v) in c.send_waits() {
            area.wait(f, v);
        }
        let value = if s.round == 0 {
            payload(s.chunk, me)
        } else {
            // SAFETY: checked by the model (written by this rank's receive, ordered by `after`).
            area.local[me][s.chunk].with(|p| unsafe { *p })
        };
        // SAFETY: checked by the model (exclusive by the schedule).
        area.data[c.slot()][me].with_mut(|p| unsafe { *p = value });
        area.signal(c.send_signal());
    }
}

fn recv(area: &Area, me: usize) {
    for (s, c) in area.steps(me) {
        for (f, v) in c.recv_waits() {
            area.wait(f, v);
        }
        for w in (0..RANKS).filter(|&w| w != me) {
            // SAFETY: checked by the model (no concurrent writer by the schedule).
            let got = area.data[c.slot()][w].with(|p| unsafe { *p });
            let want = if s.round == 0 {
                payload(s.chunk, w)
            } else {
                produced(s.chunk, w)
            };
            assert_eq!(got, want, "rank {me} read step {} of rank {w}", s.g);
        }
        if s.round == 0 && area.rounds > 1 {
            let out = produced(s.chunk, me);
            // SAFETY: checked by the model (read by this rank's send of the next round).
            area.local[me][s.chunk].with_mut(|p| unsafe { *p = out });
        }
        area.signal(c.recv_signal());
    }
}

fn model(chunks: usize, rounds: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(1);
    b.check(move || {
        let area = Arc::new(Area::new(chunks, rounds));
        let threads: Vec<_> = [(0, true), (1, true), (1, false)]
            .into_iter()
            .map(|(rank, is_send)| {
                let a = area.clone();
                loom::thread::spawn(move || {
                    if is_send {
                        send(&a, rank)
                    } else {
                        recv(&a, rank)
                    }
                })
            })
            .collect();
        recv(&area, 0);
        for t in threads {
            t.join().expect("stream");
        }
    });
}

#[test]
fn loom_pipeline_slots_are_never_overwritten_while_read() {
    model(3, 1);
}

#[test]
fn loom_later_rounds_stage_what_the_earlier_round_produced() {
    model(2, 2);
}
