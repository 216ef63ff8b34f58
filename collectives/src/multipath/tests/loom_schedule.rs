//! Loom model of the PCIe pipeline's flag schedule ([`crate::multipath::schedule`]): two
//! ranks, each with a send and a receive "stream" (threads here), a pipeline two slots deep and
//! three chunks, so that a slot is reused. Staged data lives in loom cells: a receiver reading a
//! slot while its writer stages the next chunk into it is a data race loom reports, and a
//! receiver reading the wrong chunk fails the value check. Flags are a mutex-protected table
//! with a condition variable (a stream's wait blocks rather than spins, which keeps the model
//! finite); like the GPU's stream memory operations, a flag write publishes what was staged
//! before it and a satisfied wait sees it. A rank reads its peers' pieces only
//! (its own data it takes from its device): the schedule lets its own next chunk be staged
//! while it still reads the current one, and the model confirms that reading its own piece
//! would race. Flags behave like the GPU's stream
//! memory operations: writes publish (release) everything staged before them, waits acquire.

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Condvar, Mutex};

use crate::multipath::schedule::{ChunkFlags, Flag};

const RANKS: usize = 2;
const SLOTS: usize = 2;
const CHUNKS: u64 = 3;

struct Area {
    /// `ready[0..RANKS]` then `consumed[0..RANKS]`.
    flags: Mutex<[u32; 2 * RANKS]>,
    changed: Condvar,
    /// `data[slot][writer]`: what the writer staged.
    data: [[UnsafeCell<u64>; RANKS]; SLOTS],
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
}

/// What rank `w` stages for chunk `g`.
fn payload(g: u64, w: usize) -> u64 {
    g * 10 + w as u64 + 1
}

fn send(area: &Area, me: usize) {
    for g in 0..CHUNKS {
        let c = ChunkFlags {
            g,
            me,
            nranks: RANKS,
            slots: SLOTS,
        };
        for (f, v) in c.send_waits() {
            area.wait(f, v);
        }
        // SAFETY: checked by the model (exclusive by the schedule).
        area.data[c.slot()][me].with_mut(|p| unsafe { *p = payload(g, me) });
        area.signal(c.send_signal());
    }
}

fn recv(area: &Area, me: usize) {
    for g in 0..CHUNKS {
        let c = ChunkFlags {
            g,
            me,
            nranks: RANKS,
            slots: SLOTS,
        };
        for (f, v) in c.recv_waits() {
            area.wait(f, v);
        }
        for w in (0..RANKS).filter(|&w| w != me) {
            // SAFETY: checked by the model (no concurrent writer by the schedule).
            let got = area.data[c.slot()][w].with(|p| unsafe { *p });
            assert_eq!(got, payload(g, w), "rank {me} read chunk {g} of rank {w}");
        }
        area.signal(c.recv_signal());
    }
}

#[test]
fn loom_pipeline_slots_are_never_overwritten_while_read() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(1);
    b.check(|| {
        let area = Arc::new(Area {
            flags: Mutex::new([0; 2 * RANKS]),
            changed: Condvar::new(),
            data: [
                [UnsafeCell::new(0), UnsafeCell::new(0)],
                [UnsafeCell::new(0), UnsafeCell::new(0)],
            ],
        });
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
