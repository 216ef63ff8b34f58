//! Layout of the host memory one domain's ranks share on a host: a header (identity,
//! arrivals, per-rank status), the pipeline's flags, and the staging slots.
//!
//! ```text
//! 0            header (one page): magic, version, nranks, slots, slot_bytes, total length,
//!              arrivals, parameter-store state, status[MAX_RANKS], released[MAX_RANKS]
//! flags_off    ready[r], consumed[r]  — one 32-bit flag per 64-byte line, written by GPUs
//! data_off     slot s, writer w: data_off + (s * nranks + w) * slot_bytes   (s < slots)
//! ```
//! Everything starts zeroed (a fresh segment). The first rank to arrive fills in the identity;
//! later ones check it, so ranks with different settings refuse to share (and stay fast-only)
//! instead of corrupting each other.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::{Error, Result};

/// Most ranks of one domain on one host.
pub const MAX_RANKS: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"ampcPCIe");
const VERSION: u32 = 2;
const PAGE: usize = 4096;
const LINE: usize = 64;

/// Status a rank publishes once it tried to set up its PCIe resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankStatus {
    /// Not yet published.
    Unknown = 0,
    /// Ready to carry the PCIe part.
    Ready = 1,
    /// Set-up failed: the domain must stay fast-only.
    Failed = 2,
    /// The rank's PCIe part failed during a call: it released its flags, so calls in flight on
    /// the domain have undefined results, and the domain stays fast-only.
    Broken = 3,
}

/// Offsets of the shared area for one domain (`nranks` is its capacity: communicators split
/// off a parent use the parent's layout with fewer ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Ranks of the domain.
    pub nranks: usize,
    /// Staging slots per writer (pipeline depth).
    pub slots: usize,
    /// Bytes of one writer's slot (one pipeline chunk).
    pub slot_bytes: usize,
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    nranks: AtomicU32,
    slots: AtomicU32,
    _pad: AtomicU32,
    slot_bytes: AtomicU64,
    total: AtomicU64,
    arrivals: AtomicU32,
    store: AtomicU32,
    status: [AtomicU32; MAX_RANKS],
    /// The value a rank's flags are released to, once fixed (bit 32 set; see
    /// [`HeaderRef::release_target`]).
    released: [AtomicU64; MAX_RANKS],
}

const _: () = assert!(size_of::<Header>() <= PAGE);

impl Layout {
    /// A layout; `nranks` in `1..=MAX_RANKS`, `slot_bytes` a multiple of 4 KiB.
    pub fn new(nranks: usize, slots: usize, slot_bytes: usize) -> Result<Layout> {
        if nranks == 0
            || nranks > MAX_RANKS
            || slots == 0
            || slot_bytes == 0
            || !slot_bytes.is_multiple_of(PAGE)
        {
            return Err(Error::InvalidArgument(format!(
                "PCIe staging layout: nranks {nranks} (1..={MAX_RANKS}), slots {slots}, slot bytes {slot_bytes} (multiple of {PAGE})"
            )));
        }
        Ok(Layout {
            nranks,
            slots,
            slot_bytes,
        })
    }

    /// Offset of the flags.
    pub fn flags_off(&self) -> usize {
        PAGE
    }

    /// Offset of writer `rank`'s "chunk written" flag.
    pub fn ready_off(&self, rank: usize) -> usize {
        self.flags_off() + rank * LINE
    }

    /// Offset of reader `rank`'s "chunk consumed" flag.
    pub fn consumed_off(&self, rank: usize) -> usize {
        self.flags_off() + (MAX_RANKS + rank) * LINE
    }

    /// Offset of the staging data.
    pub fn data_off(&self) -> usize {
        (self.flags_off() + 2 * MAX_RANKS * LINE).next_multiple_of(PAGE)
    }

    /// Offset of writer `writer`'s slot `slot`.
    pub fn slot_off(&self, slot: usize, writer: usize) -> usize {
        self.data_off() + (slot * self.nranks + writer) * self.slot_bytes
    }

    /// Total bytes of the area.
    pub fn total(&self) -> usize {
        self.data_off() + self.slots * self.nranks * self.slot_bytes
    }
}

/// The header of a mapped area.
pub struct HeaderRef<'a> {
    h: &'a Header,
}

impl<'a> HeaderRef<'a> {
    /// Views the header at `base`.
    ///
    /// # Safety
    /// `base` must be page-aligned memory of at least one page that stays mapped for `'a` and
    /// is only accessed atomically by every process sharing it.
    pub unsafe fn new(base: *mut u8) -> HeaderRef<'a> {
        // SAFETY: the caller guarantees alignment, size and atomic-only access; Header is all
        // atomics, for which any bit pattern (including zero) is valid.
        HeaderRef {
            h: unsafe { &*base.cast::<Header>() },
        }
    }

    /// Writes the identity if this is the first rank to arrive, or checks it otherwise; then
    /// counts this rank's arrival and returns the number of arrivals so far (this one included).
    pub fn arrive(&self, layout: &Layout) -> Result<u32> {
        let total = layout.total() as u64;
        match self
            .h
            .total
            .compare_exchange(0, total, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.h.nranks.store(layout.nranks as u32, Ordering::Relaxed);
                self.h.slots.store(layout.slots as u32, Ordering::Relaxed);
                self.h
                    .slot_bytes
                    .store(layout.slot_bytes as u64, Ordering::Relaxed);
                self.h.version.store(VERSION, Ordering::Relaxed);
                self.h.magic.store(MAGIC, Ordering::Release);
            }
            Err(t) if t != total => {
                return Err(Error::InvalidUsage(format!(
                    "PCIe staging area holds {t} bytes, this rank expects {total}: ranks use different settings"
                )));
            }
            Err(_) => {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while self.h.magic.load(Ordering::Acquire) != MAGIC {
                    if std::time::Instant::now() > deadline {
                        return Err(Error::Timeout(
                            "PCIe staging area header never initialised".into(),
                        ));
                    }
                    std::thread::yield_now();
                }
                let same = self.h.version.load(Ordering::Relaxed) == VERSION
                    && self.h.nranks.load(Ordering::Relaxed) as usize == layout.nranks
                    && self.h.slots.load(Ordering::Relaxed) as usize == layout.slots
                    && self.h.slot_bytes.load(Ordering::Relaxed) as usize == layout.slot_bytes;
                if !same {
                    return Err(Error::InvalidUsage(
                        "PCIe staging area was set up with other settings (version, ranks, slots or chunk size)".into(),
                    ));
                }
            }
        }
        Ok(self.h.arrivals.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// Ranks that have arrived.
    pub fn arrivals(&self) -> u32 {
        self.h.arrivals.load(Ordering::Acquire)
    }

    /// Claims the initialisation of the domain's parameter store; exactly one caller, the
    /// first, gets `true` and must call [`HeaderRef::store_initialised`] when done.
    pub fn claim_store(&self) -> bool {
        self.h
            .store
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Marks the parameter store initialised.
    pub fn store_initialised(&self) {
        self.h.store.store(2, Ordering::Release);
    }

    /// Whether the parameter store is initialised.
    pub fn store_is_initialised(&self) -> bool {
        self.h.store.load(Ordering::Acquire) == 2
    }

    /// Publishes `rank`'s status.
    pub fn set_status(&self, rank: usize, s: RankStatus) {
        self.h.status[rank].store(s as u32, Ordering::Release);
    }

    /// The value `rank`'s flags are released to: `proposed` if this is the first release (in any
    /// process), else the value the first one fixed, so that releasing again, from the host or
    /// from a stream, writes the same value (moving a flag ahead twice could take it a half
    /// cycle ahead, which the GPU's cyclic comparison reads as behind).
    pub fn release_target(&self, rank: usize, proposed: u32) -> u32 {
        let set = (1u64 << 32) | u64::from(proposed);
        match self.h.released[rank].compare_exchange(0, set, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => proposed,
            Err(fixed) => fixed as u32,
        }
    }

    /// `rank`'s published status.
    pub fn status(&self, rank: usize) -> RankStatus {
        match self.h.status[rank].load(Ordering::Acquire) {
            1 => RankStatus::Ready,
            2 => RankStatus::Failed,
            3 => RankStatus::Broken,
            _ => RankStatus::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        let l = Layout::new(8, 4, 1 << 20).unwrap();
        assert!(l.consumed_off(MAX_RANKS - 1) + LINE <= l.data_off());
        assert_eq!(l.data_off() % PAGE, 0);
        assert_eq!(l.slot_off(0, 1) - l.slot_off(0, 0), 1 << 20);
        assert_eq!(l.slot_off(1, 0), l.slot_off(0, 7) + (1 << 20));
        assert_eq!(l.total(), l.slot_off(3, 7) + (1 << 20));
        assert!(Layout::new(0, 1, 4096).is_err());
        assert!(Layout::new(2, 1, 1000).is_err());
        assert!(Layout::new(MAX_RANKS + 1, 1, 4096).is_err());
    }

    #[test]
    fn arrival_checks_settings() {
        let mut page = vec![0u64; PAGE / 8];
        let base = page.as_mut_ptr().cast::<u8>();
        // SAFETY: a page of zeroed, 8-aligned memory only accessed through the header.
        let h = unsafe { HeaderRef::new(base) };
        let l = Layout::new(2, 2, 4096).unwrap();
        assert_eq!(h.arrive(&l).unwrap(), 1);
        assert_eq!(h.arrive(&l).unwrap(), 2);
        assert!(h.arrive(&Layout::new(2, 3, 4096).unwrap()).is_err());
        assert_eq!(h.arrivals(), 2);
        assert_eq!(h.status(1), RankStatus::Unknown);
        h.set_status(1, RankStatus::Ready);
        assert_eq!(h.status(1), RankStatus::Ready);
        h.set_status(1, RankStatus::Broken);
        assert_eq!(h.status(1), RankStatus::Broken);
        assert_eq!(h.release_target(1, 7), 7);
        assert_eq!(h.release_target(1, 9), 7, "fixed by the first release");
        assert_eq!(h.release_target(0, 0), 0);
        assert_eq!(h.release_target(0, 5), 0, "zero is a value like any other");
    }
}
