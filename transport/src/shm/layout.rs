//! Byte layout of a rank's shared-memory segment.
//!
//! ```text
//! 0      header (one page): magic, version, rank, world, pid, doorbell, failure flag and
//!        message, current-operation description, CMA probe word
//! 4096   control block from peer 0, from peer 1, ... (one per rank, page-rounded):
//!          CTS FIFO    depth x 32 B   written by that peer as receiver, read by us as sender
//!          completions depth x 16 B   written by that peer as sender (imm, len)
//!          ack counter 4 B            bumped by that peer (TxAck)
//!          credits     depth x 4 B    written by that peer as receiver (receive seq done)
//!          eager slots depth x 1088 B written by that peer as sender: idx, tag, len, then
//!                                     up to EAGER_MAX bytes of payload
//! ...    window: the communicator's registered CCL buffers (page-aligned)
//! ```
//! Every field a peer writes is accessed atomically; a field is written by exactly one rank.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::device::{CtsEntry, OpRecord};

pub const MAGIC: u64 = u64::from_le_bytes(*b"ampcclsh");
pub const VERSION: u32 = 2;
const PAGE: usize = 4096;

// Header offsets.
pub const H_MAGIC: usize = 0;
pub const H_VERSION: usize = 8;
pub const H_RANK: usize = 12;
pub const H_WORLD: usize = 16;
pub const H_PID: usize = 20;
pub const H_DOORBELL: usize = 64;
pub const H_FAILED: usize = 128;
/// Peers' writes into or reads from this rank's user memory in progress (see
/// `ShmDevice::access`).
pub const H_USER_ACCESSES: usize = 160;
pub const H_PROBE: usize = 192;
/// Seqlock-protected areas: a sequence word followed by the words. `H_OP` holds the history
/// of the operations this rank ran ([`View::put_op`]), `H_FAIL_MSG` a text.
pub const H_OP: usize = 256;
pub const H_FAIL_MSG: usize = 1024;
pub const TEXT_LEN: usize = 504;
/// 64-bit words a seqlock area holds.
const MAX_WORDS: usize = (TEXT_LEN - 8) / 8;
/// Words of one operation record in the history at `H_OP`.
const OP_WORDS: usize = size_of::<OpRecord>() / 8;
/// Operation records the history keeps: enough that a peer which ran ahead of a mismatch by a
/// few operations is still described by the operation that mismatched.
pub const OP_HISTORY: usize = MAX_WORDS / OP_WORDS;
const _: () = assert!(OP_HISTORY >= 4);

const CTS_SIZE: usize = 32;
const IMM_SIZE: usize = 16;
const CREDIT_SIZE: usize = 4;
/// Largest eager message (see [`crate::eager`]): at or below it, one one-way trip beats the
/// rendezvous' two; above it the extra copy out of the slot starts to cost more than a trip
/// saves, and the slots (`depth` of them per peer) would cost more memory.
pub const EAGER_MAX: usize = 1024;
/// Eager slot header: idx, tag, len (u32 each) and padding; the payload follows.
pub const EAGER_HEADER: usize = 16;
const EAGER_STRIDE: usize = (EAGER_HEADER + EAGER_MAX).next_multiple_of(64);

/// Sizes that define a segment.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub world: usize,
    pub depth: usize,
    pub window: usize,
}

impl Layout {
    /// Offset of the credit words inside a control block.
    fn credits_rel(&self) -> usize {
        self.depth * (CTS_SIZE + IMM_SIZE) + 64
    }
    /// Offset of the eager slots inside a control block.
    fn eager_rel(&self) -> usize {
        (self.credits_rel() + self.depth * CREDIT_SIZE).next_multiple_of(64)
    }
    fn ctrl_size(&self) -> usize {
        (self.eager_rel() + self.depth * EAGER_STRIDE).next_multiple_of(PAGE)
    }
    /// Offset of the control block written by `peer`.
    pub fn ctrl(&self, peer: usize) -> usize {
        PAGE + peer * self.ctrl_size()
    }
    pub fn cts(&self, peer: usize, slot: usize) -> usize {
        self.ctrl(peer) + slot * CTS_SIZE
    }
    pub fn imm(&self, peer: usize, slot: usize) -> usize {
        self.ctrl(peer) + self.depth * CTS_SIZE + slot * IMM_SIZE
    }
    pub fn ack(&self, peer: usize) -> usize {
        self.ctrl(peer) + self.depth * (CTS_SIZE + IMM_SIZE)
    }
    pub fn credit(&self, peer: usize, slot: usize) -> usize {
        self.ctrl(peer) + self.credits_rel() + slot * CREDIT_SIZE
    }
    /// Offset of eager slot `slot` written by `peer` (its header; the payload follows).
    pub fn eager(&self, peer: usize, slot: usize) -> usize {
        self.ctrl(peer) + self.eager_rel() + slot * EAGER_STRIDE
    }
    pub fn window_off(&self) -> usize {
        PAGE + self.world * self.ctrl_size()
    }
    pub fn total(&self) -> usize {
        self.window_off() + self.window.next_multiple_of(PAGE)
    }
}

/// Raw view of one mapped segment (ours or a peer's).
#[derive(Clone, Copy)]
pub struct View {
    pub base: *mut u8,
    pub len: usize,
}

// SAFETY: a view is an address into a mapping the owner keeps alive; all shared fields are
// accessed atomically.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

impl View {
    pub fn u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: in bounds of the mapping, aligned, and only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }
    pub fn u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: as for `u32`.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }

    /// Stores a CTS entry, `idx` last with release.
    pub fn put_cts(&self, off: usize, e: &CtsEntry) {
        self.u64(off).store(e.addr, Ordering::Relaxed);
        self.u64(off + 8).store(e.size, Ordering::Relaxed);
        self.u32(off + 16).store(e.key, Ordering::Relaxed);
        self.u32(off + 20).store(e.nreqs, Ordering::Relaxed);
        self.u32(off + 24).store(e.tag, Ordering::Relaxed);
        self.u32(off + 28).store(e.idx, Ordering::Release);
    }

    /// Loads a CTS entry if its `idx` equals `idx` (acquire).
    pub fn get_cts(&self, off: usize, idx: u32) -> Option<CtsEntry> {
        if self.u32(off + 28).load(Ordering::Acquire) != idx {
            return None;
        }
        Some(CtsEntry {
            addr: self.u64(off).load(Ordering::Relaxed),
            size: self.u64(off + 8).load(Ordering::Relaxed),
            key: self.u32(off + 16).load(Ordering::Relaxed),
            nreqs: self.u32(off + 20).load(Ordering::Relaxed),
            tag: self.u32(off + 24).load(Ordering::Relaxed),
            idx,
        })
    }

    /// Writes `words` into the seqlock area at `off`: a sequence word (odd while writing), a
    /// length word, then up to `(TEXT_LEN - 8) / 8` 64-bit words.
    pub fn put_words(&self, off: usize, words: &[u64]) {
        let seq = self.u32(off);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let n = words.len().min(MAX_WORDS);
        self.u32(off + 4).store(n as u32, Ordering::Relaxed);
        for (i, w) in words[..n].iter().enumerate() {
            self.u64(off + 8 + i * 8).store(*w, Ordering::Relaxed);
        }
        seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Reads the seqlock area at `off` (`None` if never written or torn twice).
    pub fn get_words(&self, off: usize) -> Option<Vec<u64>> {
        for _ in 0..2 {
            let s1 = self.u32(off).load(Ordering::Acquire);
            if s1 == 0 || s1 % 2 == 1 {
                continue;
            }
            let n = (self.u32(off + 4).load(Ordering::Relaxed) as usize).min(MAX_WORDS);
            let out: Vec<u64> = (0..n)
                .map(|i| self.u64(off + 8 + i * 8).load(Ordering::Relaxed))
                .collect();
            std::sync::atomic::fence(Ordering::Acquire);
            if self.u32(off).load(Ordering::Relaxed) == s1 {
                return Some(out);
            }
        }
        None
    }

    /// Appends an operation record to the history at `off`, a seqlock area whose length word
    /// counts the records ever written; the oldest of [`OP_HISTORY`] is overwritten.
    pub fn put_op(&self, off: usize, record: &OpRecord) {
        let seq = self.u32(off);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let count = self.u32(off + 4).load(Ordering::Relaxed);
        let at = off + 8 + (count as usize % OP_HISTORY) * OP_WORDS * 8;
        for (i, w) in record.iter().enumerate() {
            self.u64(at + i * 8).store(*w, Ordering::Relaxed);
        }
        self.u32(off + 4)
            .store(count.wrapping_add(1), Ordering::Relaxed);
        seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The records of the history at `off`, newest first (empty if none was written or the
    /// area was torn twice while read).
    pub fn ops(&self, off: usize) -> Vec<OpRecord> {
        for _ in 0..2 {
            let s1 = self.u32(off).load(Ordering::Acquire);
            if s1 == 0 || s1 % 2 == 1 {
                continue;
            }
            let count = self.u32(off + 4).load(Ordering::Relaxed) as usize;
            let records: Vec<OpRecord> = (0..count.min(OP_HISTORY))
                .map(|back| {
                    let at = off + 8 + ((count - 1 - back) % OP_HISTORY) * OP_WORDS * 8;
                    std::array::from_fn(|i| self.u64(at + i * 8).load(Ordering::Relaxed))
                })
                .collect();
            std::sync::atomic::fence(Ordering::Acquire);
            if self.u32(off).load(Ordering::Relaxed) == s1 {
                return records;
            }
        }
        Vec::new()
    }

    /// Writes `text` (truncated, zero-padded to whole words; first word = byte length).
    pub fn put_text(&self, off: usize, text: &str) {
        let bytes = &text.as_bytes()[..text.len().min((MAX_WORDS - 1) * 8)];
        let mut words = vec![bytes.len() as u64];
        words.extend(bytes.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        }));
        self.put_words(off, &words);
    }

    /// Reads what [`View::put_text`] wrote.
    pub fn get_text(&self, off: usize) -> Option<String> {
        let words = self.get_words(off)?;
        let (len, rest) = words.split_first()?;
        let bytes: Vec<u8> = rest.iter().flat_map(|w| w.to_le_bytes()).collect();
        Some(String::from_utf8_lossy(&bytes[..(*len as usize).min(bytes.len())]).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The history keeps the newest `OP_HISTORY` records, newest first.
    #[test]
    fn the_operation_history_keeps_the_newest_records() {
        let mut mem = vec![0u64; 1024];
        let v = View {
            base: mem.as_mut_ptr().cast(),
            len: mem.len() * 8,
        };
        assert!(v.ops(H_OP).is_empty());
        let record = |n: u64| -> OpRecord { std::array::from_fn(|i| n * 100 + i as u64) };
        let total = OP_HISTORY as u64 + 3;
        for n in 0..total {
            v.put_op(H_OP, &record(n));
        }
        let newest: Vec<OpRecord> = (0..OP_HISTORY as u64)
            .map(|k| record(total - 1 - k))
            .collect();
        assert_eq!(v.ops(H_OP), newest);
        const { assert!(H_OP + 8 + OP_HISTORY * OP_WORDS * 8 <= H_OP + TEXT_LEN) };
    }
}
