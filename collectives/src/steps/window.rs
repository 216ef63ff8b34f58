//! Receive slots in the CCL input buffer (`CclIn`), the window peers write into.
//!
//! A pipeline that receives piece after piece needs two slots at a time: the piece being
//! received and the one being consumed. Fixed slots (the two halves of the buffer) make every
//! piece land on the same few lines, which the receiving core has just read and the sending
//! core must take back for each write; a 2-thread producer/consumer copy through two fixed
//! slots runs at a fraction of the rate it reaches through slots rotating over a wider span
//! (docs/TUNING.md, `AMPCCL_WINDOW_SPAN`). So a [`Window`] cuts the buffer into as many slots of
//! the pieces' size as fit and hands them out in turn, and the next call of the communicator
//! goes on where this one stopped (the cursor), instead of starting again at the first slot.
//! The slots rotate over at most [`SPAN`] bytes: windows wider than that cost more in the
//! shared cache than they save in hand-offs.
//!
//! Consecutive slots never overlap (at least two fit), so the double-buffer discipline of the
//! algorithms holds: slot `k + 2` may reuse slot `k`'s memory, never slot `k + 1`. Calls of a
//! communicator run one after the other, so a call may start anywhere. Streams of one call
//! that receive concurrently take disjoint parts of the buffer ([`Window::part`]), each
//! rotating the same way.

use std::cell::Cell;

use ampccl_runtime::param::{Param, Unit};

use crate::resource::{AlgResourceResponse, BufKind, Mem};

/// Slots are placed on cache-line boundaries where two of them still fit.
const LINE: usize = 64;

/// Bytes of a window that slots rotate over, at most (more where two slots need more). Wider
/// spans leave more lines of the last calls in the cache for the next one to take back, but
/// every rank's window competes with the user's buffers for the shared last-level cache; much
/// narrower ones hold too few slots of mid-sized pieces. Also caps ring pieces at half of it
/// ([`crate::steps::ring::Ring::new`]). Measured value: docs/TUNING.md.
pub static SPAN: Param = Param::new(
    "WINDOW_SPAN",
    2 << 20,
    (64 << 10, 1 << 30),
    Unit::Bytes,
    "most bytes of the CCL input buffer that receive slots rotate over",
);

/// The slots of one call: `count` slots of `stride` bytes from byte `base` of `CclIn`, the
/// first at the cursor (a position relative to `base`).
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    base: usize,
    stride: usize,
    count: usize,
    first: usize,
    cursor: &'a Cell<usize>,
}

impl<'a> Window<'a> {
    /// Slots of `slot_bytes` each, at most half of the buffer (callers size their pieces so).
    pub fn new(res: &AlgResourceResponse<'a>, slot_bytes: usize) -> Window<'a> {
        Window::part(res, 0, 1, slot_bytes)
    }

    /// Slots of `slot_bytes` each in part `i` of `parts` equal, disjoint parts of the buffer
    /// (one per stream receiving at the same time); at most [`Window::max_slot`].
    pub fn part(
        res: &AlgResourceResponse<'a>,
        i: usize,
        parts: usize,
        slot_bytes: usize,
    ) -> Window<'a> {
        let size = part_size(res.ccl_in_size, parts);
        Window::over(i * size, size, res.ccl_in_cursor, slot_bytes)
    }

    /// The largest slot, in whole `elem`-byte elements, of a part of `parts` (0: not even one
    /// element fits twice).
    pub fn max_slot(res: &AlgResourceResponse<'_>, parts: usize, elem: usize) -> usize {
        part_size(res.ccl_in_size, parts) / 2 / elem * elem
    }

    /// Slots of `slot_bytes` in the first [`SPAN`] (or two slots) of the `size` bytes from
    /// `base`, starting at `cursor`.
    fn over(base: usize, size: usize, cursor: &'a Cell<usize>, slot_bytes: usize) -> Window<'a> {
        debug_assert!(
            slot_bytes <= size / 2,
            "slot {slot_bytes} of a {size}-byte window"
        );
        let lined = slot_bytes.div_ceil(LINE) * LINE;
        let size = size.min(SPAN.bytes().max(2 * lined));
        let stride = if 2 * lined <= size { lined } else { slot_bytes }.max(1);
        let count = (size / stride).max(1);
        Window {
            base,
            stride,
            count,
            first: cursor.get().div_ceil(stride) % count,
            cursor,
        }
    }

    /// Whether any `n` consecutive slots are pairwise disjoint (the window holds `n` slots).
    pub fn holds(&self, n: usize) -> bool {
        self.count >= n
    }

    /// Slot `k` of this call; the next call starts after it.
    pub fn slot(&self, k: usize) -> Mem {
        let i = (self.first + k) % self.count;
        self.cursor.set((i + 1) * self.stride);
        Mem::of(BufKind::CclIn).add(self.base + i * self.stride)
    }
}

/// Bytes of each of `parts` parts of a `size`-byte buffer, whole cache lines where one fits.
fn part_size(size: usize, parts: usize) -> usize {
    let part = size / parts;
    if part >= LINE {
        part / LINE * LINE
    } else {
        part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots rotate over the whole buffer, consecutive ones never overlap, and a later call
    /// starts where the earlier one stopped, whatever the slot sizes.
    #[test]
    fn slots_rotate_and_never_overlap_their_neighbour() {
        let cursor = Cell::new(0);
        let w = Window::over(0, 1000, &cursor, 100);
        let offs: Vec<usize> = (0..12).map(|k| w.slot(k).off).collect();
        assert_eq!(
            offs,
            [0, 128, 256, 384, 512, 640, 768, 0, 128, 256, 384, 512]
        );
        assert_eq!(cursor.get(), 640);
        // A call of other sizes goes on from the cursor.
        let w = Window::over(0, 1000, &cursor, 300);
        assert_eq!((w.slot(0).off, w.slot(1).off, w.slot(2).off), (640, 0, 320));
        for start in 0..1000 {
            for bytes in [1, 63, 64, 333, 499, 500] {
                cursor.set(start);
                let w = Window::over(0, 1000, &cursor, bytes);
                for k in 0..8 {
                    let (a, b) = (w.slot(k).off, w.slot(k + 1).off);
                    assert!(
                        a + bytes <= 1000 && b + bytes <= 1000,
                        "inside, {start}/{bytes}"
                    );
                    assert!(a + bytes <= b || b + bytes <= a, "{start}/{bytes}: {a} {b}");
                }
            }
        }
    }

    /// A window holds as many disjoint slots as fit whole cache lines apart.
    #[test]
    fn a_window_holds_the_slots_that_fit() {
        let cursor = Cell::new(0);
        let w = Window::over(0, 1000, &cursor, 100);
        assert!(w.holds(7) && !w.holds(8));
        let w = Window::over(0, 256, &cursor, 8);
        assert!(w.holds(4) && !w.holds(5));
    }

    /// Slots of a large buffer rotate over its first `SPAN` bytes, or over two slots where
    /// those need more.
    #[test]
    fn slots_rotate_over_at_most_the_span() {
        let cursor = Cell::new(0);
        let span = SPAN.bytes();
        let w = Window::over(0, 4 * span, &cursor, span / 4);
        let offs: Vec<usize> = (0..5).map(|k| w.slot(k).off).collect();
        assert_eq!(offs, [0, span / 4, span / 2, 3 * span / 4, 0]);
        let w = Window::over(0, 4 * span, &cursor, span);
        let offs: Vec<usize> = (0..3).map(|k| w.slot(k).off).collect();
        assert_eq!(offs, [span, 0, span]);
    }

    /// Concurrent streams' parts are disjoint: every slot of part `i` lies inside it.
    #[test]
    fn parts_keep_their_slots_inside() {
        let cursor = Cell::new(0);
        let (size, parts) = (2000, 2);
        let part = part_size(size, parts);
        assert_eq!(part, 960);
        for start in [0, 500, 1999] {
            cursor.set(start);
            for i in 0..parts {
                let w = Window::over(i * part, part, &cursor, 300);
                for k in 0..6 {
                    let off = w.slot(k).off;
                    assert!(
                        off >= i * part && off + 300 <= (i + 1) * part,
                        "{i}/{k}: {off}"
                    );
                }
            }
        }
    }
}
