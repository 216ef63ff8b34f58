//! An in-memory two-rank [`RmaDevice`] for unit tests of the protocol and links.

use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

use crate::device::{CtsEntry, EagerHeader, IMM_ERROR, RmaDevice};
use std::sync::Arc;

/// Largest eager message of the test device (small, so tests exercise both variants).
const EAGER_MAX: usize = 64;

/// An eager slot: `(idx, tag, payload)`.
type EagerSlot = (u32, u32, Vec<u8>);

struct Side {
    fifo: Vec<Mutex<CtsEntry>>,
    imm: Vec<Mutex<(u32, u64)>>,
    eager: Vec<Mutex<EagerSlot>>,
    credits: Vec<AtomicU32>,
    acks: AtomicU32,
    window: UnsafeCell<Box<[u8]>>,
}

struct Shared {
    sides: [Side; 2],
}

// SAFETY: windows are written only through `write` at addresses a receiver handed out, and read
// by the receiver after the completion that orders them (as real RMA memory); `read` copies
// out of an offer the owner leaves alone until the read's completion.
unsafe impl Sync for Shared {}

/// One endpoint of an in-memory pair: rank `me` talks to rank `1 - me` (peer index `1 - me`).
pub struct PairDevice {
    me: usize,
    shared: Arc<Shared>,
    /// Our sends' writes count as still reading their buffers ([`RmaDevice::send_done`]), as
    /// a device's whose writes complete later.
    sends_held: AtomicBool,
}

impl PairDevice {
    /// Two connected endpoints with FIFO depth `depth` and `window` bytes of window each.
    pub fn pair(depth: usize, window: usize) -> (PairDevice, PairDevice) {
        let side = || Side {
            fifo: (0..depth)
                .map(|_| Mutex::new(CtsEntry::default()))
                .collect(),
            imm: (0..depth).map(|_| Mutex::new((0, 0))).collect(),
            eager: (0..depth).map(|_| Mutex::new((0, 0, Vec::new()))).collect(),
            credits: (0..depth).map(|_| AtomicU32::new(0)).collect(),
            acks: AtomicU32::new(0),
            window: UnsafeCell::new(vec![0u8; window].into_boxed_slice()),
        };
        let shared = Arc::new(Shared {
            sides: [side(), side()],
        });
        (
            PairDevice {
                me: 0,
                shared: shared.clone(),
                sends_held: AtomicBool::new(false),
            },
            PairDevice {
                me: 1,
                shared,
                sends_held: AtomicBool::new(false),
            },
        )
    }

    fn side(&self, who: usize) -> &Side {
        &self.shared.sides[who]
    }

    fn base(&self, who: usize) -> (*mut u8, usize) {
        // SAFETY: only the pointer and length are taken.
        let w = unsafe { &mut *self.side(who).window.get() };
        (w.as_mut_ptr(), w.len())
    }

    /// Pointer into our own window.
    pub fn window_ptr(&self, off: usize) -> *mut u8 {
        // SAFETY: tests keep `off` inside the window.
        unsafe { self.base(self.me).0.add(off) }
    }

    /// Holds our sends incomplete (`true`) until released (`false`).
    pub fn hold_sends(&self, held: bool) {
        self.sends_held.store(held, Ordering::Release);
    }

    /// Copy of our window bytes.
    pub fn window(&self, off: usize, len: usize) -> Vec<u8> {
        let (p, n) = self.base(self.me);
        assert!(off + len <= n);
        // SAFETY: in bounds; tests read after completion.
        unsafe { std::slice::from_raw_parts(p.add(off), len) }.to_vec()
    }
}

impl RmaDevice for PairDevice {
    fn fifo_depth(&self) -> usize {
        self.side(0).fifo.len()
    }
    fn channels(&self) -> usize {
        2
    }
    fn expose(&self, ptr: *mut u8, len: usize) -> Option<(u32, u64)> {
        let (base, n) = self.base(self.me);
        let off = (ptr as usize).checked_sub(base as usize)?;
        (off + len <= n).then_some((1, off as u64))
    }
    fn exposes_user_memory(&self) -> bool {
        false
    }
    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()> {
        *self.side(peer).fifo[slot].lock().unwrap() = *entry;
        Ok(())
    }
    fn poll_cts(&self, _peer: usize, slot: usize, idx: u32) -> Option<CtsEntry> {
        let e = *self.side(self.me).fifo[slot].lock().unwrap();
        (e.idx == idx).then_some(e)
    }
    unsafe fn write(
        &self,
        peer: usize,
        src: *const u8,
        len: usize,
        key: u32,
        addr: u64,
    ) -> Result<()> {
        let (base, n) = self.base(peer);
        if key != 1 || (addr as usize).checked_add(len).is_none_or(|end| end > n) {
            return Err(Error::Internal("write outside the peer's window".into()));
        }
        // SAFETY: bounds checked; src valid by contract.
        unsafe { std::ptr::copy_nonoverlapping(src, base.add(addr as usize), len) };
        Ok(())
    }
    unsafe fn read(
        &self,
        peer: usize,
        dst: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        _: CopyTo,
    ) -> Result<()> {
        let (base, n) = self.base(peer);
        if key != 1 || (addr as usize).checked_add(len).is_none_or(|end| end > n) {
            return Err(Error::Internal("read outside the peer's window".into()));
        }
        // SAFETY: bounds checked; dst valid by contract.
        unsafe { std::ptr::copy_nonoverlapping(base.add(addr as usize), dst, len) };
        Ok(())
    }
    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()> {
        *self.side(peer).imm[slot].lock().unwrap() = (imm, len);
        Ok(())
    }
    fn send_done(&self, _peer: usize, _slot: usize) -> bool {
        !self.sends_held.load(Ordering::Acquire)
    }
    fn poll_imm(&self, _peer: usize, slot: usize, want: u32) -> Option<(u32, u64)> {
        let (imm, len) = *self.side(self.me).imm[slot].lock().unwrap();
        (imm & !IMM_ERROR == want).then_some((imm, len))
    }
    fn eager_max(&self) -> usize {
        EAGER_MAX
    }
    unsafe fn eager_write(
        &self,
        peer: usize,
        slot: usize,
        idx: u32,
        tag: u32,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        assert!(len <= EAGER_MAX);
        // SAFETY: src valid for len by contract (a zero-length message may pass null).
        let data = if len == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(src, len) }.to_vec()
        };
        *self.side(peer).eager[slot].lock().unwrap() = (idx, tag, data);
        Ok(())
    }
    fn eager_peek(&self, _peer: usize, slot: usize, idx: u32) -> Option<EagerHeader> {
        let e = self.side(self.me).eager[slot].lock().unwrap();
        (e.0 == idx).then(|| EagerHeader {
            tag: e.1,
            len: e.2.len(),
        })
    }
    unsafe fn eager_read(&self, _peer: usize, slot: usize, dst: *mut u8, len: usize) {
        let e = self.side(self.me).eager[slot].lock().unwrap();
        // SAFETY: dst valid for len by contract; the slot holds at least len bytes.
        unsafe { std::ptr::copy_nonoverlapping(e.2.as_ptr(), dst, len) };
    }
    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()> {
        self.side(peer).credits[slot].store(seq.wrapping_add(1), Ordering::Release);
        Ok(())
    }
    fn credit(&self, _peer: usize, slot: usize) -> u32 {
        self.side(self.me).credits[slot].load(Ordering::Acquire)
    }
    fn post_ack(&self, peer: usize) -> Result<()> {
        self.side(peer).acks.fetch_add(1, Ordering::Release);
        Ok(())
    }
    fn acks(&self, _peer: usize) -> u32 {
        self.side(self.me).acks.load(Ordering::Acquire)
    }
    fn peer_health(&self, _peer: usize) -> Result<()> {
        Ok(())
    }
    fn peer_desc(&self, peer: usize) -> String {
        format!("rank {peer}")
    }
}

/// The shape of an [`RmaDevice`] loom model (of the protocol, of eager messages): one FIFO
/// slot, one channel, peers that never fail and send no acks. Expands inside its `impl`.
#[cfg(ampccl_loom)]
macro_rules! model_shape {
    () => {
        fn fifo_depth(&self) -> usize {
            1
        }
        fn channels(&self) -> usize {
            1
        }
        fn post_ack(&self, _: usize) -> Result<()> {
            Ok(())
        }
        fn acks(&self, _: usize) -> u32 {
            0
        }
        fn peer_health(&self, _: usize) -> Result<()> {
            Ok(())
        }
        fn peer_desc(&self, peer: usize) -> String {
            format!("rank {peer}")
        }
    };
}
#[cfg(ampccl_loom)]
pub(crate) use model_shape;
