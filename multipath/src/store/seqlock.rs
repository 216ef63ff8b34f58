//! Single-writer seqlock over atomic words (no torn value is ever returned).
//!
//! Writer: `seq` goes odd, a release fence, the data words (relaxed), `seq` even (release).
//! Reader: `seq` (acquire, must be even), the data words (relaxed), an acquire fence, `seq`
//! again (must be unchanged). Data words are atomics, so a racing read is not undefined
//! behaviour, only discarded. A writer that died mid-write leaves `seq` odd: readers give up
//! after a bounded number of tries (no lock is ever held), and the next write completes it.

use ampccl_runtime::sync::{AtomicU64, Ordering, fence, spin_hint};

/// Writes `vals` into `data` (same length) under `seq`. One writer per `seq` at a time.
pub(super) fn write(seq: &AtomicU64, data: &[AtomicU64], vals: &[u64]) {
    let s = seq.load(Ordering::Relaxed);
    let odd = s | 1;
    seq.store(odd, Ordering::Relaxed);
    fence(Ordering::Release);
    for (d, v) in data.iter().zip(vals) {
        d.store(*v, Ordering::Relaxed);
    }
    seq.store(odd.wrapping_add(1), Ordering::Release);
}

/// Reads `data` into `out` under `seq`; returns the (even) sequence number read, or `None`
/// after `tries` attempts saw a write in progress.
pub(super) fn read(
    seq: &AtomicU64,
    data: &[AtomicU64],
    out: &mut [u64],
    tries: u32,
) -> Option<u64> {
    for _ in 0..tries {
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 0 {
            for (o, d) in out.iter_mut().zip(data) {
                *o = d.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == s1 {
                return Some(s1);
            }
        }
        spin_hint();
    }
    None
}
