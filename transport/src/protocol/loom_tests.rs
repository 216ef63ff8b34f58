//! Loom models of the protocol's orderings: the real functions over loom's atomics.

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::*;
use crate::device::EagerHeader;

/// One clear-to-send slot (B's offers, in A's memory), one completion slot (A's reads, in
/// B's memory) and B's offered buffer: what [`post_offer`], [`try_read`] and [`poll_recv`]
/// touch, over loom's atomics and cells, so the model checks the real functions' orderings.
struct Shared {
    cts_size: AtomicU64,
    cts_nreqs: AtomicU32,
    cts_tag: AtomicU32,
    cts_idx: AtomicU32,
    imm: AtomicU32,
    imm_len: AtomicU64,
    offered: UnsafeCell<[u8; 4]>,
}

/// Rank `me` of the pair: 0 reads, 1 offers.
struct Dev {
    me: usize,
    sh: loom::sync::Arc<Shared>,
}

// SAFETY: the offered cell is accessed only under the protocol the model checks.
unsafe impl Sync for Dev {}
// SAFETY: as above.
unsafe impl Send for Dev {}

impl RmaDevice for Dev {
    fn expose(&self, _: *mut u8, _: usize) -> Option<(u32, u64)> {
        Some((1, 0))
    }
    fn exposes_user_memory(&self) -> bool {
        false
    }
    fn post_cts(&self, _: usize, _: usize, e: &CtsEntry) -> Result<()> {
        assert_eq!(self.me, 1);
        let sh = &self.sh;
        sh.cts_size.store(e.size, Ordering::Relaxed);
        sh.cts_nreqs.store(e.nreqs, Ordering::Relaxed);
        sh.cts_tag.store(e.tag, Ordering::Relaxed);
        sh.cts_idx.store(e.idx, Ordering::Release);
        Ok(())
    }
    fn poll_cts(&self, _: usize, _: usize, idx: u32) -> Option<CtsEntry> {
        assert_eq!(self.me, 0);
        let sh = &self.sh;
        (sh.cts_idx.load(Ordering::Acquire) == idx).then(|| CtsEntry {
            addr: 0,
            size: sh.cts_size.load(Ordering::Relaxed),
            key: 1,
            nreqs: sh.cts_nreqs.load(Ordering::Relaxed),
            tag: sh.cts_tag.load(Ordering::Relaxed),
            idx,
        })
    }
    unsafe fn write(&self, _: usize, _: *const u8, _: usize, _: u32, _: u64) -> Result<()> {
        unreachable!("the model only reads")
    }
    unsafe fn read(
        &self,
        _: usize,
        dst: *mut u8,
        len: usize,
        _: u32,
        _: u64,
        _: CopyTo,
    ) -> Result<()> {
        assert_eq!(self.me, 0);
        // SAFETY: dst holds len <= 4 bytes (model contract).
        self.sh
            .offered
            .with(|p| unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), dst, len) });
        Ok(())
    }
    fn write_imm(&self, _: usize, _: usize, imm: u32, len: u64) -> Result<()> {
        self.sh.imm_len.store(len, Ordering::Relaxed);
        self.sh.imm.store(imm, Ordering::Release);
        Ok(())
    }
    fn poll_imm(&self, _: usize, _: usize, want: u32) -> Option<(u32, u64)> {
        let imm = self.sh.imm.load(Ordering::Acquire);
        (imm & !IMM_ERROR == want).then(|| (imm, self.sh.imm_len.load(Ordering::Relaxed)))
    }
    fn eager_max(&self) -> usize {
        0
    }
    unsafe fn eager_write(
        &self,
        _: usize,
        _: usize,
        _: u32,
        _: u32,
        _: *const u8,
        _: usize,
    ) -> Result<()> {
        unreachable!("no eager messages in the model")
    }
    fn eager_peek(&self, _: usize, _: usize, _: u32) -> Option<EagerHeader> {
        None
    }
    unsafe fn eager_read(&self, _: usize, _: usize, _: *mut u8, _: usize) {
        unreachable!("no eager messages in the model")
    }
    fn post_credit(&self, _: usize, _: usize, _: u32) -> Result<()> {
        Ok(())
    }
    fn credit(&self, _: usize, _: usize) -> u32 {
        0
    }
    crate::testdev::model_shape!();
}

/// Two offers of one buffer through one slot: the owner fills the buffer, offers it, and
/// refills it only once the offer completed; the reader reads each offer whole (loom's
/// cell reports any overlap of the owner's refill with the peer's read) and in order.
#[test]
fn loom_an_offered_buffer_is_rewritten_only_after_the_read() {
    loom::model(|| {
        let sh = loom::sync::Arc::new(Shared {
            cts_size: AtomicU64::new(0),
            cts_nreqs: AtomicU32::new(0),
            cts_tag: AtomicU32::new(0),
            cts_idx: AtomicU32::new(0),
            imm: AtomicU32::new(0),
            imm_len: AtomicU64::new(0),
            offered: UnsafeCell::new([0; 4]),
        });
        let (a, b) = (
            Dev {
                me: 0,
                sh: sh.clone(),
            },
            Dev { me: 1, sh },
        );
        let reader = loom::thread::spawn(move || {
            for seq in 0..2u32 {
                let mut got = [0u8; 4];
                // SAFETY: got is valid for 4 bytes.
                while unsafe { try_read(&a, 1, seq, got.as_mut_ptr(), 4, CopyTo::Output, 7) }
                    .is_pending()
                {
                    loom::thread::yield_now();
                }
                assert_eq!(got, [seq as u8 + 1; 4]);
            }
        });
        for seq in 0..2u32 {
            // SAFETY: the buffer is ours until offered (the previous offer completed).
            b.sh.offered
                .with_mut(|p| unsafe { *p = [seq as u8 + 1; 4] });
            let ptr = std::ptr::null::<u8>();
            assert!(post_offer(&b, 0, seq, true, ptr, 4, 7).is_ready());
            loop {
                match poll_recv(&b, 0, seq, 4) {
                    Poll::Ready(r) => break r.unwrap(),
                    Poll::Pending => loom::thread::yield_now(),
                }
            }
        }
        reader.join().unwrap();
    });
}
