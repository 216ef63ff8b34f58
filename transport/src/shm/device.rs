//! The shared-memory [`RmaDevice`]: every rank maps every peer's segment; a one-sided write is a
//! single copy into the peer's registered window or its shared user memory
//! ([`SharedMem`](super::SharedMem), mapped here at first use; or, with cross-memory attach,
//! straight into the peer's user buffer), the immediate and the CTS are atomic stores into the
//! peer's control block, and each of them rings the peer's doorbell.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use ampccl_runtime::copy::SharedCopy;
use ampccl_runtime::doorbell::Doorbell;
#[cfg(not(ampccl_loom))]
use ampccl_runtime::doorbell::DoorbellWords;
use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

use super::layout::*;
use super::segment::Segment;
use crate::device::{CtsEntry, EagerHeader, IMM_ERROR, OpRecord, RmaDevice, eager_payload};
use crate::shm::cma;
use crate::shm::shared::{self, PeerMaps};

/// Longest a failing rank waits for peers' accesses to its user memory to finish.
pub const USER_ACCESS_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Memory keys of CTS entries.
const KEY_WINDOW: u32 = 1;
const KEY_USER: u32 = 2;

/// Connected shared-memory device of one rank.
pub struct ShmDevice {
    rank: usize,
    layout: Layout,
    pids: Vec<u32>,
    /// The communicator rank of each of the device's ranks (they differ where the device
    /// serves the ranks of one host of a larger communicator), for messages.
    names: Vec<usize>,
    /// Segments of every rank, index = rank (ours included); they keep `views` mapped.
    _segs: Vec<Arc<Segment>>,
    views: Vec<View>,
    bells: Vec<Doorbell>,
    /// The copy of writes into each peer's window (index = rank).
    stores: Vec<SharedCopy>,
    cma: bool,
    /// Peers' shared user memory mapped here.
    peer_maps: PeerMaps,
    /// Turns a peer's operation record (see [`ShmDevice::set_op`]) into text.
    op_formatter: OnceLock<OpFormatter>,
}

/// Formats an operation record published with [`ShmDevice::set_op`].
pub use crate::transport::OpFormatter;

/// The doorbell in the header of a peer's segment.
#[cfg(not(ampccl_loom))]
fn peer_doorbell(v: &View, s: &Arc<Segment>) -> Doorbell {
    // SAFETY: the doorbell words lie in the header of a mapping kept alive by `s`.
    unsafe { Doorbell::from_shared(v.base.add(H_DOORBELL).cast::<DoorbellWords>(), s.clone()) }
}

/// Under loom the shm device is only compiled (for the crates above it), never run; loom's
/// doorbell cannot live in shared memory.
#[cfg(ampccl_loom)]
fn peer_doorbell(_: &View, _: &Arc<Segment>) -> Doorbell {
    Doorbell::new()
}

impl ShmDevice {
    pub(super) fn new(
        rank: usize,
        layout: Layout,
        (pids, names): (Vec<u32>, Vec<usize>),
        segs: Vec<Arc<Segment>>,
        cma: bool,
    ) -> ShmDevice {
        let segs_len = segs.len();
        let views: Vec<View> = segs
            .iter()
            .map(|s| View {
                base: s.as_ptr(),
                len: s.len(),
            })
            .collect();
        let bells = views
            .iter()
            .zip(&segs)
            .map(|(v, s)| peer_doorbell(v, s))
            .collect();
        ShmDevice {
            rank,
            layout,
            pids,
            names,
            _segs: segs,
            views,
            bells,
            stores: (0..segs_len).map(|_| SharedCopy::default()).collect(),
            cma,
            peer_maps: PeerMaps::default(),
            op_formatter: OnceLock::new(),
        }
    }

    /// Sets how peers' operation records are described in mismatch errors (once).
    pub fn set_op_formatter(&self, f: OpFormatter) {
        let _ = self.op_formatter.set(f);
    }

    /// Our own doorbell (peers ring it when they write to us).
    pub fn doorbell(&self) -> Doorbell {
        self.bells[self.rank].clone()
    }

    /// Our registered window: `(base pointer, length)`.
    pub fn window(&self) -> (*mut u8, usize) {
        let v = &self.views[self.rank];
        // SAFETY: the window offset lies inside our mapping.
        (
            unsafe { v.base.add(self.layout.window_off()) },
            self.layout.window,
        )
    }

    /// Whether cross-memory attach is in use.
    pub fn uses_cma(&self) -> bool {
        self.cma
    }

    /// Publishes a compact record of the operation this rank is running (binary, so it costs
    /// a few stores per operation; peers format it only when reporting a mismatch).
    pub fn set_op(&self, record: &OpRecord) {
        self.views[self.rank].put_op(H_OP, record);
    }

    /// Marks this rank failed so peers stop waiting for it.
    ///
    /// Returns once no peer is accessing our user memory any more (or after
    /// [`USER_ACCESS_GRACE`]), so the caller may give the user's buffers back: a peer that
    /// checks the flag after this sees it and refuses to access them (see `access`).
    pub fn mark_failed(&self, msg: &str) {
        let me = &self.views[self.rank];
        me.put_text(H_FAIL_MSG, msg);
        me.u32(H_FAILED).store(1, Ordering::SeqCst);
        for (r, b) in self.bells.iter().enumerate() {
            if r != self.rank {
                b.ring();
            }
        }
        let t0 = std::time::Instant::now();
        while me.u32(H_USER_ACCESSES).load(Ordering::SeqCst) != 0
            && t0.elapsed() < USER_ACCESS_GRACE
        {
            std::thread::yield_now();
        }
    }

    /// Error naming the first peer that marked itself failed.
    pub fn check_peers_failed(&self) -> Result<()> {
        for (r, v) in self.views.iter().enumerate() {
            if r != self.rank && v.u32(H_FAILED).load(Ordering::Acquire) != 0 {
                let msg = v.get_text(H_FAIL_MSG).unwrap_or_default();
                return Err(Error::Remote(format!(
                    "{} failed: {msg}",
                    self.peer_desc(r)
                )));
            }
        }
        Ok(())
    }

    /// Runs `f`, an access to `peer`'s user memory, announced to the peer: its buffers may be
    /// handed back to its application once it fails, so the access is counted, then the
    /// peer's failure flag checked (the peer sets the flag, then waits for announced accesses
    /// to finish: `mark_failed`).
    fn user_access(&self, peer: usize, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let v = &self.views[peer];
        v.u32(H_USER_ACCESSES).fetch_add(1, Ordering::SeqCst);
        let r = if v.u32(H_FAILED).load(Ordering::SeqCst) != 0 {
            Err(Error::Remote(format!(
                "{} failed before its buffer was accessed",
                self.peer_desc(peer)
            )))
        } else {
            f().map_err(|e| {
                // A peer killed during the transfer is a dead peer, not a system error.
                if process_alive(self.pids[peer]) {
                    e
                } else {
                    Error::Remote(format!(
                        "{} died while this rank accessed its buffer",
                        self.peer_desc(peer)
                    ))
                }
            })
        };
        v.u32(H_USER_ACCESSES).fetch_sub(1, Ordering::SeqCst);
        r
    }

    fn mine(&self) -> &View {
        &self.views[self.rank]
    }

    /// A one-sided transfer between local `[buf, buf+len)` and `peer`'s `(key, addr)`: into
    /// the peer (`read` is `None`) or out of it (memory the peer offered, the copy stored as
    /// `read` says).
    ///
    /// # Safety
    /// `buf` must be valid for `len` reads (a write) or writes (a read).
    unsafe fn access(
        &self,
        peer: usize,
        buf: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        read: Option<CopyTo>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let dir = match read {
            None => cma::Direction::Write,
            Some(_) => cma::Direction::Read,
        };
        let local = |remote: *mut u8| {
            let (dst, src) = match dir {
                cma::Direction::Write => (remote, buf.cast_const()),
                cma::Direction::Read => (buf, remote.cast_const()),
            };
            // SAFETY (both arms): the remote range is the peer's for exactly this transfer
            // (bounds checked by the callers below); it does not touch it until our immediate
            // arrives (or, failed, until we are done here); `buf` is valid by contract; the two
            // lie in different buffers, so they do not overlap.
            match read {
                // The peer reads what we write at once.
                None => unsafe { self.stores[peer].copy(dst, src, len) },
                Some(to) => unsafe { ampccl_runtime::copy::copy_to(to, dst, src, len) },
            }
        };
        match key {
            KEY_WINDOW => {
                let v = &self.views[peer];
                let off = addr as usize;
                let win = self.layout.window_off();
                if off < win || off.checked_add(len).is_none_or(|end| end > v.len) {
                    return Err(Error::Remote(format!(
                        "{} named memory outside its window ({off}+{len})",
                        self.peer_desc(peer)
                    )));
                }
                // SAFETY: inside the peer's mapping (checked above).
                local(unsafe { v.base.add(off) });
                Ok(())
            }
            KEY_USER => self.user_access(peer, || {
                if self.pids[peer] == std::process::id() {
                    // A rank of this same process (thread mode): its address is ours.
                    local(addr as usize as *mut u8);
                    return Ok(());
                }
                let (pid, remote) = (self.pids[peer], addr as usize);
                match dir {
                    cma::Direction::Write => {
                        // SAFETY: `buf` valid for `len` reads by contract.
                        let data = unsafe { std::slice::from_raw_parts(buf, len) };
                        cma::write(pid, data, remote)
                    }
                    cma::Direction::Read => {
                        // SAFETY: `buf` valid for `len` writes by contract and borrowed by
                        // nothing else while the slice lives.
                        let data = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                        cma::read(pid, data, remote)
                    }
                }
            }),
            k if k & shared::KEY_BASE != 0 => self.user_access(peer, || {
                let m = self
                    .peer_maps
                    .resolve(self.pids[peer], k, addr, len, || self.peer_desc(peer))?;
                local(m.ptr());
                Ok(())
            }),
            k => Err(Error::Remote(format!(
                "{} sent unknown memory key {k}",
                self.peer_desc(peer)
            ))),
        }
    }
}

impl RmaDevice for ShmDevice {
    fn fifo_depth(&self) -> usize {
        self.layout.depth
    }

    fn channels(&self) -> usize {
        1
    }

    fn expose(&self, ptr: *mut u8, len: usize) -> Option<(u32, u64)> {
        let (base, wlen) = self.window();
        if let Some(off) = (ptr as usize).checked_sub(base as usize)
            && off + len <= wlen
        {
            return Some((KEY_WINDOW, (self.layout.window_off() + off) as u64));
        }
        if len > 0
            && let Some(f) = shared::find(ptr, len)
        {
            return Some((shared::key_of(&f), shared::addr_of(&f)));
        }
        self.cma.then_some((KEY_USER, ptr as u64))
    }

    fn exposes_user_memory(&self) -> bool {
        self.cma
    }

    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()> {
        // Our CTS for receives from `peer` lives in `peer`'s segment, in the block we write.
        self.views[peer].put_cts(self.layout.cts(self.rank, slot), entry);
        self.bells[peer].ring();
        Ok(())
    }

    fn poll_cts(&self, peer: usize, slot: usize, idx: u32) -> Option<CtsEntry> {
        self.mine().get_cts(self.layout.cts(peer, slot), idx)
    }

    unsafe fn write(
        &self,
        peer: usize,
        src: *const u8,
        len: usize,
        key: u32,
        addr: u64,
    ) -> Result<()> {
        // SAFETY: `src` valid for `len` reads by contract.
        unsafe { self.access(peer, src.cast_mut(), len, key, addr, None) }
    }

    unsafe fn read(
        &self,
        peer: usize,
        dst: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        to: CopyTo,
    ) -> Result<()> {
        // SAFETY: `dst` valid for `len` writes by contract.
        unsafe { self.access(peer, dst, len, key, addr, Some(to)) }
    }

    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()> {
        let v = &self.views[peer];
        let off = self.layout.imm(self.rank, slot);
        v.u64(off + 8).store(len, Ordering::Relaxed);
        v.u32(off).store(imm, Ordering::Release);
        self.bells[peer].ring();
        Ok(())
    }

    fn poll_imm(&self, peer: usize, slot: usize, want: u32) -> Option<(u32, u64)> {
        let v = self.mine();
        let off = self.layout.imm(peer, slot);
        let imm = v.u32(off).load(Ordering::Acquire);
        (imm & !IMM_ERROR == want).then(|| (imm, v.u64(off + 8).load(Ordering::Relaxed)))
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
        // SAFETY: `src` is valid for `len` reads by contract.
        let payload = unsafe { eager_payload(src, len, EAGER_MAX)? };
        let v = &self.views[peer];
        let off = self.layout.eager(self.rank, slot);
        // SAFETY: the slot lies inside the peer's mapping (layout) and holds EAGER_MAX payload
        // bytes (checked above); the receiver reads it only after seeing `idx` below and
        // returns it (credit) before we may write it again.
        unsafe {
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                v.base.add(off + EAGER_HEADER),
                payload.len(),
            )
        };
        v.u32(off + 4).store(tag, Ordering::Relaxed);
        v.u32(off + 8).store(len as u32, Ordering::Relaxed);
        v.u32(off).store(idx, Ordering::Release);
        self.bells[peer].ring();
        Ok(())
    }

    fn eager_peek(&self, peer: usize, slot: usize, idx: u32) -> Option<EagerHeader> {
        let v = self.mine();
        let off = self.layout.eager(peer, slot);
        (v.u32(off).load(Ordering::Acquire) == idx).then(|| EagerHeader {
            tag: v.u32(off + 4).load(Ordering::Relaxed),
            len: v.u32(off + 8).load(Ordering::Relaxed) as usize,
        })
    }

    unsafe fn eager_read(&self, peer: usize, slot: usize, dst: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        let off = self.layout.eager(peer, slot) + EAGER_HEADER;
        debug_assert!(len <= EAGER_MAX);
        // SAFETY: the payload lies inside our mapping; the caller saw the header (acquire) and
        // the sender does not write the slot again before our credit; `dst` valid by contract.
        unsafe { std::ptr::copy_nonoverlapping(self.mine().base.add(off), dst, len) };
    }

    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()> {
        // A sender out of credit may be asleep on its doorbell.
        self.views[peer]
            .u32(self.layout.credit(self.rank, slot))
            .store(seq.wrapping_add(1), Ordering::Release);
        self.bells[peer].ring();
        Ok(())
    }

    fn credit(&self, peer: usize, slot: usize) -> u32 {
        self.mine()
            .u32(self.layout.credit(peer, slot))
            .load(Ordering::Acquire)
    }

    fn post_ack(&self, peer: usize) -> Result<()> {
        self.views[peer]
            .u32(self.layout.ack(self.rank))
            .fetch_add(1, Ordering::Release);
        self.bells[peer].ring();
        Ok(())
    }

    fn acks(&self, peer: usize) -> u32 {
        self.mine()
            .u32(self.layout.ack(peer))
            .load(Ordering::Acquire)
    }

    fn peer_health(&self, peer: usize) -> Result<()> {
        self.check_peers_failed()?;
        if !process_alive(self.pids[peer]) {
            return Err(Error::Remote(format!(
                "{} is dead (its process exited or was killed)",
                self.peer_desc(peer)
            )));
        }
        Ok(())
    }

    fn peer_desc(&self, peer: usize) -> String {
        format!("rank {} (pid {})", self.names[peer], self.pids[peer])
    }

    fn op_history(&self, peer: Option<usize>) -> Vec<OpRecord> {
        self.views[peer.unwrap_or(self.rank)].ops(H_OP)
    }

    fn peer_op(&self, peer: usize, tag: u32) -> Option<String> {
        let ops = self.op_history(Some(peer));
        let record = ops.iter().find(|r| r[0] as u32 == tag).or(ops.first())?;
        self.op_formatter.get().and_then(|f| f(record))
    }

    fn local_op(&self, tag: u32) -> Option<String> {
        self.peer_op(self.rank, tag)
    }
}

/// Whether process `pid` exists and has not exited. A zombie (exited, not yet reaped by its
/// parent) still answers `kill(pid, 0)`, so `/proc/<pid>/stat` is consulted too.
fn process_alive(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return true;
    };
    if rustix::process::test_kill_process(p).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself contain ')'.
        Ok(stat) => !matches!(
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next()),
            Some("Z" | "X")
        ),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::process_alive;

    #[test]
    fn zombies_and_dead_processes_are_not_alive() {
        assert!(process_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited but not reaped yet: a zombie.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!process_alive(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }
}
