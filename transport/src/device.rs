//! The one-sided "RMA device" interface the receiver-driven protocol runs over.
//!
//! A device connects the local rank to every peer of a communicator and offers what an RDMA
//! NIC offers: memory a peer may write into is named by `(key, addr)`; a one-sided
//! write; a write-with-immediate whose immediate and length land in the receiver's completion
//! slot; and the clear-to-send FIFO, which the receiver fills in the sender's memory with one
//! remote write. A clear-to-send may instead offer the poster's memory for the peer to read (a
//! one-sided read, then the immediate). For small messages it also offers pre-posted eager
//! slots (the sender writes payload and header in one go, no clear-to-send needed) and
//! per-slot credit words through which the receiver tells the sender a slot is free again. The
//! shared-memory provider implements it with stores into mapped segments (or cross-memory
//! attach), a verbs provider would post RDMA WRITE / WRITE_WITH_IMM / READ.

use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

/// Clear-to-send entry: where and how much the receiver accepts (NCCL's FIFO layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    /// Address in the receiver's memory (meaning depends on `key`).
    pub addr: u64,
    /// Bytes the receiver accepts.
    pub size: u64,
    /// Memory key the device resolves (`rkey` on RDMA).
    pub key: u32,
    /// Number of writes the sender splits the data into (striping over channels), with
    /// [`CTS_READ`] set when the entry offers the memory for reading instead.
    pub nreqs: u32,
    /// Operation fingerprint; the sender refuses a CTS whose tag differs from its own.
    pub tag: u32,
    /// Sequence number + 1 of this receive; written last, marks the entry valid.
    pub idx: u32,
}

/// Bit of [`CtsEntry::nreqs`]: the poster offers its memory for the peer to read (a read
/// offer) instead of accepting a write into it.
pub const CTS_READ: u32 = 1 << 31;

/// An eager message as the receiver finds it in its slot: the sender's operation tag and the
/// byte count (the payload stays in the slot until [`RmaDevice::eager_read`] copies it out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerHeader {
    pub tag: u32,
    pub len: usize,
}

/// Immediate value flag: the sender failed this transfer (e.g. a tag mismatch) and tells the
/// receiver so instead of hanging it.
pub const IMM_ERROR: u32 = 1 << 31;

/// What a rank publishes about each operation it runs, for its peers' mismatch checks and
/// messages: word 0 holds the operation's tag (its fingerprint), word 1 its number among the
/// communicator's collectives ([`NOT_COLLECTIVE`] for a send or receive); the rest describes
/// it for the communicator's formatter.
pub type OpRecord = [u64; 9];

/// Word 1 of a send's or receive's [`OpRecord`].
pub const NOT_COLLECTIVE: u64 = u64::MAX;

/// A one-sided communication device between the local rank and its peers.
pub trait RmaDevice: Send + Sync {
    /// Depth of each clear-to-send FIFO (and completion ring).
    fn fifo_depth(&self) -> usize;
    /// Number of writes a transfer is striped into.
    fn channels(&self) -> usize;
    /// Names local memory `[ptr, ptr+len)` for peers as `(key, addr)`, or `None` when peers
    /// cannot write it (not inside a registered window, and no way to write user memory).
    fn expose(&self, ptr: *mut u8, len: usize) -> Option<(u32, u64)>;
    /// True when [`RmaDevice::expose`] accepts any local memory, not only registered windows.
    fn exposes_user_memory(&self) -> bool;
    /// Writes `entry` into `peer`'s FIFO slot `slot` (the `idx` field last, with release).
    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()>;
    /// Our FIFO slot `slot` (written by `peer`) if its `idx` equals `idx`.
    fn poll_cts(&self, peer: usize, slot: usize, idx: u32) -> Option<CtsEntry>;
    /// One-sided write of local `[src, src+len)` to `peer`'s `(key, addr)`.
    ///
    /// # Safety
    /// `src` must be valid for `len` reads.
    unsafe fn write(
        &self,
        peer: usize,
        src: *const u8,
        len: usize,
        key: u32,
        addr: u64,
    ) -> Result<()>;
    /// One-sided read of `peer`'s `(key, addr)` (memory the peer offered for reading) into
    /// local `[dst, dst+len)`. A device that copies the data stores it for who reads it next
    /// (`to`: [`CopyTo::Output`], an operation's output nothing reads soon, may take streaming
    /// stores that bypass the cache).
    ///
    /// # Safety
    /// `dst` must be valid for `len` writes.
    unsafe fn read(
        &self,
        peer: usize,
        dst: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        to: CopyTo,
    ) -> Result<()>;
    /// Delivers the immediate `imm` and byte count `len` to `peer`'s completion slot `slot`,
    /// ordered after every earlier write to that peer.
    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()>;
    /// Whether the send in FIFO slot `slot` to `peer` no longer reads its buffer: every write
    /// of it completed. A device whose writes complete once issued (shared memory, or one
    /// that copies them out before it returns) keeps the default.
    fn send_done(&self, _peer: usize, _slot: usize) -> bool {
        true
    }
    /// Our completion slot `slot` written by `peer`: `(imm, len)` if `imm & !IMM_ERROR == want`.
    fn poll_imm(&self, peer: usize, slot: usize, want: u32) -> Option<(u32, u64)>;
    /// Largest message sent eagerly (0: the device has no eager slots). Both sides of a link
    /// see the same value, so both know from the length alone which protocol a message uses.
    fn eager_max(&self) -> usize;
    /// Writes an eager message into `peer`'s eager slot `slot`: `len <= eager_max()` bytes of
    /// payload, the tag and length, then `idx` last with release.
    ///
    /// # Safety
    /// `src` must be valid for `len` reads.
    unsafe fn eager_write(
        &self,
        peer: usize,
        slot: usize,
        idx: u32,
        tag: u32,
        src: *const u8,
        len: usize,
    ) -> Result<()>;
    /// Our eager slot `slot` written by `peer`, if it holds message `idx`.
    fn eager_peek(&self, peer: usize, slot: usize, idx: u32) -> Option<EagerHeader>;
    /// Copies `len` bytes of the payload in our eager slot `slot` (from `peer`) to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `len` writes, and the slot must hold a message of at least `len`
    /// bytes (seen with [`RmaDevice::eager_peek`]) that the peer cannot overwrite yet.
    unsafe fn eager_read(&self, peer: usize, slot: usize, dst: *mut u8, len: usize);
    /// Tells `peer` that our receive number `seq` from it completed (its eager slot and its
    /// completion slot are free again): stores `seq + 1` into `peer`'s credit word `slot`.
    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()>;
    /// The credit word `slot` that `peer` (receiving from us) wrote last; 0 if never written.
    fn credit(&self, peer: usize, slot: usize) -> u32;
    /// The credit words `first..first + out.len()` of `peer`, read together: each by
    /// [`RmaDevice::credit`] unless the provider reads them at once (where a read drives the
    /// provider's progress, as `ofi`'s does, once instead of once per word).
    fn credit_group(&self, peer: usize, first: usize, out: &mut [u32]) {
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.credit(peer, first + i);
        }
    }
    /// Adds one to `peer`'s ack counter for us (HCCL `TxAck`).
    fn post_ack(&self, peer: usize) -> Result<()>;
    /// Acks `peer` has sent us so far.
    fn acks(&self, peer: usize) -> u32;
    /// Error if `peer` is known to be dead or failed.
    fn peer_health(&self, peer: usize) -> Result<()>;
    /// "rank 3 (pid 1234)" for messages.
    fn peer_desc(&self, peer: usize) -> String;
    /// The records of the operations `peer` (`None`: this rank) ran, newest first, as far as
    /// the device keeps them (empty where it cannot see them; by default it keeps none).
    fn op_history(&self, _peer: Option<usize>) -> Vec<OpRecord> {
        Vec::new()
    }
    /// The operation of `peer` with tag `tag` (else the newest it ran), described for mismatch
    /// messages, if known (by default nothing is).
    fn peer_op(&self, _peer: usize, _tag: u32) -> Option<String> {
        None
    }
    /// The local rank's operation with tag `tag`, described as for peers, if known (by
    /// default nothing is).
    fn local_op(&self, _tag: u32) -> Option<String> {
        None
    }
}

/// The payload of an [`RmaDevice::eager_write`] as a slice, once `len` is checked against the
/// device's largest eager message `max`: a longer one is an error (the caller's bug), never an
/// overrun of the peer's slot.
///
/// # Safety
/// `src` must be valid for `len` reads for `'a` (it may dangle when `len` is 0).
pub unsafe fn eager_payload<'a>(src: *const u8, len: usize, max: usize) -> Result<&'a [u8]> {
    if len > max {
        return Err(Error::Internal(format!(
            "eager message of {len} bytes (at most {max})"
        )));
    }
    Ok(if len == 0 {
        &[]
    } else {
        // SAFETY: `src` is valid for `len` reads for `'a` (the caller's contract).
        unsafe { std::slice::from_raw_parts(src, len) }
    })
}
