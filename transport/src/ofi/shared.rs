//! [`Shared`]: what the `ofi` device shares with its progress thread (the endpoint's state
//! behind one lock, the doorbell, the engine's poll marks), and the device side's waits on the
//! endpoint: an engine's poll reads the completion queue every other time
//! ([`Shared::polled`]); a blocking wait drives the endpoint and blocks on the queues'
//! descriptors between its looks ([`Shared::wait`]); a failing operation first takes the
//! application's memory back from the provider ([`Shared::reclaim`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::mem::HostBuffer;
use ampccl_runtime::{Error, Result};

use super::device::WRITES_COMPLETE_MAX;
use super::peer::PeerCts;
use super::progress;
use super::state::State;
use super::wire::Header;
use crate::handback::{Handback, PollMark};
use crate::oplog::OpLog;
use crate::protocol;

/// Longest block on the queues' descriptors of a device-side wait between its looks at its
/// condition and deadline.
const WAIT_STEP: Duration = Duration::from_millis(1);
/// How long a failing operation waits for our writes and reads still with the provider before
/// its error returns (libfabric cancels no writes or reads): a peer that is alive completes
/// them, one that is gone fails them, so the application's memory is ours again first.
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// The device's state, shared with its progress thread.
pub struct Shared {
    pub(super) rank: usize,
    pub(super) depth: usize,
    pub(super) rails: usize,
    /// The state's `eager_max`, read here without the lock.
    pub(super) eager_max: usize,
    /// [`WRITES_COMPLETE_MAX`].
    pub(super) writes_complete_max: usize,
    state: Mutex<State>,
    pub(super) descs: Vec<String>,
    /// The completion queues' descriptors (none without wait objects).
    pub(super) wait_fds: Vec<i32>,
    virt_addr: bool,
    pub(super) bell: Doorbell,
    /// The engine's polls of the endpoint, and its word before it sleeps
    /// ([`crate::handback`]): the progress thread reads the queue only while nobody polls.
    pub(super) polled: PollMark,
    pub(super) handback: Handback,
    pub(super) window: HostBuffer,
    pub(super) failed: AtomicBool,
    /// A failure's wait for our writes and reads ran out ([`Shared::reclaim`]).
    drain_ran_out: AtomicBool,
    pub(super) ops: OpLog,
    timeout: Duration,
    /// Set when the device drops: the progress thread ends.
    pub(super) stop: AtomicBool,
}

impl Shared {
    /// The state of a device over `state` (`depth` FIFO slots, `rails` rails, a window of
    /// `window` bytes).
    pub(super) fn new(
        rank: usize,
        (depth, rails, window): (usize, usize, usize),
        state: State,
        descs: Vec<String>,
        virt_addr: bool,
        timeout: Duration,
    ) -> Result<Shared> {
        let wait_fds = state.ep.wait_fds().to_vec();
        Ok(Shared {
            rank,
            depth,
            rails,
            eager_max: state.eager_max,
            writes_complete_max: WRITES_COMPLETE_MAX.bytes(),
            state: Mutex::new(state),
            descs,
            wait_fds,
            virt_addr,
            bell: Doorbell::new(),
            polled: PollMark::default(),
            handback: Handback::new().map_err(|e| Error::system("ofi: eventfd", e))?,
            window: HostBuffer::zeroed(window),
            failed: AtomicBool::new(false),
            drain_ran_out: AtomicBool::new(false),
            ops: OpLog::default(),
            timeout,
            stop: AtomicBool::new(false),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state if nobody holds it.
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(s) => Some(s),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The state after reading the completions ready (an engine's poll). Every other poll
    /// returns the state as it is: reading the queue is a system call with socket providers,
    /// and an engine step asks about several slots in a row (a receive's eager slot, then its
    /// completion slot). Were a poll that found something followed by another read, a
    /// message landing in the step's second question would cost the next step a wasted
    /// system call before anyone looks at it; alternating, the next question sees it at once.
    pub(super) fn polled(&self) -> MutexGuard<'_, State> {
        self.polled.mark();
        let mut s = self.lock();
        if !std::mem::take(&mut s.polled_fresh) {
            s.progress();
            s.polled_fresh = true;
        }
        s
    }

    /// An error naming `peer` for a failed post.
    pub(super) fn post_err(&self, peer: usize, what: &str, why: String) -> Error {
        Error::Remote(format!("ofi: {what} to {}: {why}", self.descs[peer]))
    }

    /// Drives the endpoint until `done` says so, blocking on the completion queue between
    /// tries; fails when `peer` dies or the wait exceeds the timeout.
    pub(super) fn wait(
        &self,
        peer: usize,
        what: &str,
        mut done: impl FnMut(&mut State) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            self.polled.mark();
            let may_block = {
                let mut s = self.lock();
                let any = s.progress_all();
                if done(&mut s) {
                    return Ok(());
                }
                if let Some(why) = &s.peer(peer).dead {
                    let e = Error::Remote(format!("{} {why}", self.descs[peer]));
                    drop(s);
                    self.reclaim();
                    return Err(e);
                }
                !any && s.ep.trywait()
            };
            if Instant::now() >= deadline {
                self.reclaim();
                return Err(Error::Timeout(format!(
                    "{what} with {} took longer than {:.1} s",
                    self.descs[peer],
                    self.timeout.as_secs_f64()
                )));
            }
            if may_block {
                progress::block_on_queue(&self.wait_fds, &[], WAIT_STEP, progress::NAP_MIN);
            }
        }
    }

    /// Makes the application's memory ours again before an operation's error returns. First
    /// it withdraws the data writes still queued (reading the queue would post them), then
    /// reads the queue and waits up to [`DRAIN_WAIT`] for our writes and reads with the
    /// provider to complete or fail (data that already arrived still completes its transfer
    /// meanwhile; a queued read may still start: its waiter owns the destination until it
    /// gives up, [`State::forget_read`]); then it withdraws the writes queued meanwhile and
    /// closes every region peers may write into or read ([`State::revoke_all`]).
    ///
    /// Once a wait ran out, later failures do not wait again (each operation of the failed
    /// communicator would otherwise add its second).
    pub(super) fn reclaim(&self) {
        self.lock().withdraw_queued_writes();
        if !self.drain_ran_out.load(Ordering::Relaxed)
            && !self.drive_until(DRAIN_WAIT, |s| !s.accessing())
        {
            self.drain_ran_out.store(true, Ordering::Relaxed);
            tracing::warn!("ofi: writes or reads of ours still run after a failure");
        }
        let mut s = self.lock();
        s.withdraw_queued_writes();
        s.revoke_all();
    }

    /// Reads the queue until `done` says so, blocking on it between reads, for at most
    /// `limit`; whether `done` said so (it is asked at least once).
    pub(super) fn drive_until(
        &self,
        limit: Duration,
        mut done: impl FnMut(&State) -> bool,
    ) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let mut s = self.lock();
            s.progress_all();
            if done(&s) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            drop(s);
            progress::block_on_queue(&self.wait_fds, &[], WAIT_STEP, progress::NAP_MIN);
        }
    }

    /// Sends a control message to `peer`.
    pub(super) fn send(&self, peer: usize, h: &Header, payload: &[u8]) -> Result<()> {
        self.lock()
            .send(peer, h, payload)
            .map_err(|why| self.post_err(peer, "a message", why))
    }

    /// The remote address of `addr` in the region of `peer`'s entry `slot`, checked against
    /// the entry, as the provider addresses registered memory; with the region's key and the
    /// rail of the access. Stripe `k` of a transfer goes on rail `k` (modulo the rails): a
    /// transfer of one stripe always takes rail 0, so every connection carries a steady
    /// stream instead of one burst now and then (a paced connection left idle between bursts
    /// sends the next one slowly: docs/TUNING.md, `AMPCCL_RMA_STRIPE_MIN`).
    pub(super) fn remote(
        &self,
        s: &mut State,
        peer: usize,
        slot: u32,
        addr: u64,
        len: usize,
    ) -> Result<(u64, u64, usize)> {
        let desc = &self.descs[peer];
        let Some(&PeerCts { entry, rkey, .. }) = s.peer(peer).cts.get(slot as usize) else {
            return Err(Error::Remote(format!(
                "{desc}: its clear-to-send names the key {slot} (slots: {})",
                self.depth
            )));
        };
        let off = addr.wrapping_sub(entry.addr);
        if off > entry.size || len as u64 > entry.size - off {
            return Err(Error::Internal(format!(
                "ofi: {len} bytes at offset {off} of {desc}'s region of {} bytes",
                entry.size
            )));
        }
        let rails = s.peer(peer).addrs.len().max(1);
        let rail = protocol::stripe_of(off, entry.size as usize, entry.nreqs) % rails;
        Ok((if self.virt_addr { addr } else { off }, rkey, rail))
    }
}
