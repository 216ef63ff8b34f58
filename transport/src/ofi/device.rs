//! [`OfiDevice`]: the connected `ofi` provider ([`super::connect`]) and its RMA device and
//! transport interfaces, over the state it shares with its progress thread
//! ([`super::shared`], [`super::progress`]).

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

use super::peer::{Region, Striped};
use super::progress;
use super::shared::Shared;
use super::sys;
use super::wire::{self, Header, Kind};
use crate::device::{
    CTS_READ, CtsEntry, EagerHeader, IMM_ERROR, OpRecord, RmaDevice, eager_payload,
};
use crate::protocol;
use crate::transport::{OpFormatter, Transport};

/// Largest transfer our clear-to-send asks the sender to complete by its writes alone
/// ([`wire::CTS_WRITES_COMPLETE`]); the receiver's value holds for its transfers.
pub static WRITES_COMPLETE_MAX: Param = Param::new(
    "OFI_WRITES_COMPLETE_MAX",
    64 << 10,
    (0, 1 << 30),
    Unit::Bytes,
    "largest transfer the ofi provider's receiver completes once its data writes have landed, \
     without an immediate message from the sender (0: every transfer sends one)",
);
/// How long closing waits for our last messages to leave.
const FLUSH_WAIT: Duration = Duration::from_millis(500);
/// The `ofi` provider connected to every peer of a communicator: what it shares with its
/// progress thread, and that thread. Dropping it stops and joins the thread first, so the
/// endpoint always closes on the thread that drops the device, before the drop returns (a
/// thread that still held the device could otherwise close it while the process exits and
/// libfabric's providers unload).
pub struct OfiDevice {
    /// Dropped with the device, unless operations were still in flight (see its drop).
    shared: ManuallyDrop<Arc<Shared>>,
    progress: Option<JoinHandle<()>>,
}

impl std::ops::Deref for OfiDevice {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl OfiDevice {
    /// The device over `shared`, its progress thread started.
    pub(super) fn start(shared: Shared) -> Result<Arc<OfiDevice>> {
        let shared = Arc::new(shared);
        let theirs = shared.clone();
        let progress = std::thread::Builder::new()
            .name("ampccl-ofi-progress".into())
            .spawn(move || progress::progress_thread(theirs))
            .map_err(|e| Error::system("ofi: spawn the progress thread", e))?;
        Ok(Arc::new(OfiDevice {
            shared: ManuallyDrop::new(shared),
            progress: Some(progress),
        }))
    }
}

impl RmaDevice for OfiDevice {
    fn fifo_depth(&self) -> usize {
        self.depth
    }

    fn channels(&self) -> usize {
        self.rails
    }

    fn expose(&self, ptr: *mut u8, _len: usize) -> Option<(u32, u64)> {
        // The key is set per clear-to-send (its slot, see `post_cts`).
        Some((0, ptr as u64))
    }

    fn exposes_user_memory(&self) -> bool {
        true
    }

    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()> {
        let read = entry.nreqs & CTS_READ != 0;
        let mut s = self.lock();
        if s.peer(peer).dead.is_some() {
            // Nothing of it could reach the peer: open no region to it (the wait for its
            // message names the lost peer, `peer_health`).
            return Ok(());
        }
        // An eager-sized write entry only tells a rendezvous sender of a length mismatch: no
        // data is written into it, so it opens no region (nor does an empty one).
        let rkey = if entry.size > 0 && (read || entry.size as usize > self.eager_max) {
            let access = if read {
                sys::FI_REMOTE_READ
            } else {
                sys::FI_REMOTE_WRITE
            };
            let mr =
                s.ep.register(entry.addr as *const u8, entry.size as usize, access)
                    .map_err(|why| self.post_err(peer, "a clear-to-send", why))?;
            let rkey = mr.key;
            // Stripes beyond the first come over the other rails.
            let striped = (entry.nreqs & !CTS_READ > 1).then(|| Striped::new(&s.open_stripes));
            s.peer(peer).regions[slot] = Some(Region::new(mr, striped));
            rkey
        } else {
            0
        };
        // Up to a size, the writes complete the transfer by themselves: the sender saves the
        // immediate message, one system call and one packet on a socket provider, on the
        // path of every rendezvous round trip. Larger transfers keep it (docs/TUNING.md,
        // `AMPCCL_OFI_WRITES_COMPLETE_MAX`).
        let expected = (rkey != 0 && !read && entry.size as usize <= self.writes_complete_max)
            .then(|| {
                let writes = protocol::stripe_pieces(entry.size as usize, entry.nreqs);
                (entry.idx, writes as u32, entry.size)
            });
        let p = s.peer(peer);
        p.opened(slot, expected);
        let e = CtsEntry {
            key: slot as u32,
            ..*entry
        };
        if rkey == 0 && !read {
            // An eager receive's entry only exposes a length mismatch to a rendezvous sender:
            // it waits for the message instead (`quiet`), unless that is here already.
            let here = &p.eager[slot];
            if !(here.full && here.idx.is_none_or(|i| i == e.idx)) {
                p.quiet.push(e);
            }
            return Ok(());
        }
        // A peer that is gone by now needs no clear-to-send: the wait for its message names
        // the lost peer (`peer_health`).
        let (h, payload) = wire::cts_message(&e, expected.is_some(), rkey);
        let _ = s.send(peer, &h, &payload);
        Ok(())
    }

    fn poll_cts(&self, peer: usize, slot: usize, idx: u32) -> Option<CtsEntry> {
        let e = self.polled().peer(peer).cts[slot].entry;
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
        if len == 0 {
            return Ok(());
        }
        let mut s = self.lock();
        let (raddr, rkey, rail) = self.remote(&mut s, peer, key, addr, len)?;
        let data = wire::write_data(self.rank, key as usize);
        // SAFETY: `src` is valid for `len` reads by contract, and stays so until `write_imm`
        // (which the protocol calls before it lets the buffer go) waits for the write.
        unsafe { s.write((peer, rail), (src, len), (raddr, rkey, data)) }
            .map_err(|why| self.post_err(peer, "a write", why))?;
        s.peer(peer).writes[key as usize] += 1;
        Ok(())
    }

    unsafe fn read(
        &self,
        peer: usize,
        dst: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        _to: CopyTo,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let id = {
            let mut s = self.lock();
            let (raddr, rkey, rail) = self.remote(&mut s, peer, key, addr, len)?;
            // SAFETY: `dst` is valid for `len` writes by contract; we wait for the read below.
            unsafe { s.read((peer, rail), (dst, len), (raddr, rkey)) }
                .map_err(|why| self.post_err(peer, "a read", why))?
        };
        self.wait(peer, "a read", |s| s.take_read(id))
            .inspect_err(|_| self.lock().forget_read(id))
    }

    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()> {
        // The immediate names how many writes it completes, so it may overtake them: it
        // leaves at once, and the receiver publishes it once they have all landed.
        // The writes complete later, on the queue: the send is done once they have
        // (`send_done`), and the engine goes on meanwhile.
        let mut s = self.lock();
        let p = s.peer(peer);
        let writes = std::mem::take(&mut p.writes[slot]);
        // A clear-to-send that asked for it lets the writes complete the transfer: no
        // immediate then, unless the transfer failed. (Should the slot hold a later entry
        // already, the peer has completed this transfer, which only such writes can do.)
        let cts = p.cts[slot];
        if (cts.writes_complete || cts.entry.idx != imm & !IMM_ERROR)
            && writes > 0
            && imm & IMM_ERROR == 0
        {
            return Ok(());
        }
        let h = Header::new(Kind::Imm, slot, imm, writes, len);
        s.send(peer, &h, &[])
            .map_err(|why| self.post_err(peer, "an immediate", why))
    }

    fn send_done(&self, peer: usize, slot: usize) -> bool {
        // Most sends have no write left (eager ones never had one): only those that do read
        // the queue.
        if self.lock().peer(peer).pending[slot] == 0 {
            return true;
        }
        self.polled().peer(peer).pending[slot] == 0
    }

    fn poll_imm(&self, peer: usize, slot: usize, want: u32) -> Option<(u32, u64)> {
        let mut s = self.polled();
        let i = &s.peer(peer).imm[slot];
        (i.imm & !IMM_ERROR == want).then_some((i.imm, i.len))
    }

    fn eager_max(&self) -> usize {
        self.eager_max
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
        let payload = unsafe { eager_payload(src, len, self.eager_max)? };
        let h = Header::new(Kind::Eager, slot, idx, tag, len as u64);
        self.send(peer, &h, payload)
    }

    fn eager_peek(&self, peer: usize, slot: usize, idx: u32) -> Option<EagerHeader> {
        let mut s = self.polled();
        let e = &s.peer(peer).eager[slot];
        (e.full && e.idx.is_none_or(|i| i == idx)).then_some(EagerHeader {
            tag: e.tag,
            len: e.payload().len(),
        })
    }

    unsafe fn eager_read(&self, peer: usize, slot: usize, dst: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        let mut s = self.lock();
        let data = s.peer(peer).eager[slot].payload();
        // SAFETY: `dst` is valid for `len` writes and the slot holds at least `len` bytes (the
        // caller's contract, checked by `eager_peek`).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, len.min(data.len())) };
    }

    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()> {
        let mut s = self.lock();
        s.release_eager(peer, slot);
        let h = Header::new(Kind::Credit, slot, seq.wrapping_add(1), 0, 0);
        // Deferred: the sender needs it only `depth` messages later. The receive is complete:
        // a peer that is gone by now needs no credit.
        let _ = s.defer_credit(peer, &h);
        Ok(())
    }

    fn credit(&self, peer: usize, slot: usize) -> u32 {
        let mut word = [0];
        self.credit_group(peer, slot, &mut word);
        word[0]
    }

    fn credit_group(&self, peer: usize, first: usize, out: &mut [u32]) {
        let mut s = self.polled();
        out.copy_from_slice(&s.peer(peer).credits[first..first + out.len()]);
    }

    fn post_ack(&self, peer: usize) -> Result<()> {
        // As for credits: a peer that is gone waits for no ack.
        let _ = self.send(peer, &Header::new(Kind::Ack, 0, 0, 0, 0), &[]);
        Ok(())
    }

    fn acks(&self, peer: usize) -> u32 {
        self.polled().peer(peer).acks
    }

    fn peer_health(&self, peer: usize) -> Result<()> {
        let r = self
            .check_peers_failed()
            .and_then(|()| match &self.lock().peer(peer).dead {
                Some(why) => Err(Error::Remote(format!("{} {why}", self.descs[peer]))),
                None => Ok(()),
            });
        if r.is_err() {
            // The operation asking fails with this: its memory must be ours again first.
            self.reclaim();
        }
        r
    }

    fn peer_desc(&self, peer: usize) -> String {
        self.descs[peer].clone()
    }

    fn op_history(&self, peer: Option<usize>) -> Vec<OpRecord> {
        match peer {
            None => self.ops.newest_first(),
            // Peers' records stay on their hosts.
            Some(_) => Vec::new(),
        }
    }

    fn local_op(&self, tag: u32) -> Option<String> {
        self.ops.describe(tag)
    }
}

impl Drop for OfiDevice {
    /// Stops the progress thread and waits for it, so that nothing is posted behind the last
    /// look below and the endpoint closes here, when `shared` drops. Then lets what we sent
    /// last (a credit, a failure note, the thread's last liveness message) leave, and waits
    /// up to [`FLUSH_WAIT`] for the peers to take our eager messages
    /// ([`super::state::State::consumed`]), before the endpoint closes: with manual progress
    /// nothing moves unless we drive it.
    ///
    /// A device whose communicator failed (or whose peer is lost, or with operations still in
    /// flight by then) is left open: closing an endpoint after a connection broke mid-transfer
    /// crashes libfabric 1.17's `ofi_rxm` inside `fi_close` (about one close in five after a
    /// link loss mid-collective, `ofi_hosts_link_down_mid_collective`, also with nothing of
    /// ours in flight any more). Its endpoint, buffers and registrations then stay allocated
    /// (one device per failed communicator) and nothing of ours is freed under the provider.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.handback.give();
        if let Some(t) = self.progress.take() {
            // A panic of the thread is already reported by its hook; the device closes
            // either way.
            let _ = t.join();
        }
        self.lock().flush(true);
        // Our messages have left, and the peers have taken them (best effort: a peer that
        // never receives them costs this wait, not the close).
        let settled = self.drive_until(FLUSH_WAIT, |s| !s.sending() && s.consumed());
        let in_flight = !settled && self.lock().sending();
        let lost = self
            .lock()
            .peers
            .iter()
            .flatten()
            .any(|p| p.dead.is_some() || p.failed.is_some());
        if in_flight || lost || self.failed.load(Ordering::Acquire) {
            // Nothing may land in the application's memory once it has its communicator back.
            self.lock().revoke_all();
            tracing::info!(
                "ofi: the communicator failed: its endpoint is left open rather than closed \
                 after broken transfers"
            );
            return;
        }
        // SAFETY: `shared` is dropped once, here, and not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.shared) };
    }
}

impl Transport for OfiDevice {
    fn name(&self) -> &'static str {
        "ofi"
    }
    fn doorbell(&self) -> Doorbell {
        self.bell.clone()
    }
    fn window(&self) -> (*mut u8, usize) {
        (self.window.as_ptr(), self.window.len())
    }
    fn user_mem_links(&self) -> bool {
        true
    }
    fn is_shared_user_memory(&self, _ptr: *const u8, _len: usize) -> bool {
        false
    }
    fn set_op(&self, record: &OpRecord) {
        self.ops.push(record);
    }
    fn set_op_formatter(&self, f: OpFormatter) {
        self.ops.set_formatter(f);
    }
    fn mark_failed(&self, msg: &str) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        let text = &msg.as_bytes()[..msg.len().min(wire::MAX_TEXT)];
        let mut s = self.lock();
        for peer in (0..s.peers.len()).filter(|&p| p != self.rank) {
            // Best effort: a peer that is gone has nobody waiting for this.
            let _ = s.send(peer, &Header::new(Kind::Fail, 0, 0, 0, 0), text);
        }
        // The notes go first: a peer learns why before its accesses meet closed regions.
        drop(s);
        self.reclaim();
    }
    fn holds_frames_back(&self) -> bool {
        true
    }
    fn flush(&self) {
        self.lock().flush(false);
    }
    fn driver_sleeps(&self) {
        self.lock().flush(true);
        if self.polled.stop() {
            self.handback.give();
        }
    }
    fn check_peers_failed(&self) -> Result<()> {
        let s = self.lock();
        for p in s.peers.iter().flatten() {
            if let Some(m) = &p.failed {
                return Err(Error::Remote(format!("{} failed: {m}", p.desc)));
            }
        }
        Ok(())
    }
}
