//! The `ofi` provider's progress thread: it drives the endpoint while the engine does not.
//!
//! With manual data progress (libfabric 1.17's `tcp;ofi_rxm`, `shm`) a peer's writes land in
//! our memory only while somebody reads our completion queue, and libfabric 2.x's `tcp`,
//! although it reports automatic progress, ran no thread of its own with a wait object on the
//! queue. So between the engine's polls this thread reads the queues (all of them) and rings
//! the engine's doorbell when something arrived, and otherwise blocks on the queues' descriptors
//! (`fi_trywait`, then `poll`) and on the engine's [`crate::handback::Handback`] word; it
//! never spins. Queues without descriptors (`AMPCCL_OFI_WAIT=poll`, or a provider that offers
//! none) move only when polled: then it naps between looks, [`NAP_MIN`] at first and twice as
//! long after each look that found nothing. It also sends every peer a liveness message every
//! [`PING_EVERY`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::shared::Shared;
use super::wire::{Header, Kind};
use crate::bootstrap::poll_readable;

/// How often the progress thread sends each peer a liveness message: a send to a dead peer
/// fails, which is how its death shows within about a second.
const PING_EVERY: Duration = Duration::from_millis(300);
/// Longest sleep of the progress thread on the completion queue's descriptor.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// Without queue descriptors ([`super::fabric::Wait::Poll`], or a provider that offers
/// none) the provider moves only when polled: an idle thread naps between looks, first this
/// long, each nap that found nothing twice as long as the one before, up to [`NAP_MAX`]. A
/// waiter asleep on the engine's doorbell learns of an arrival that much later: at most about
/// as long again as it has already waited.
pub(super) const NAP_MIN: Duration = Duration::from_micros(16);
/// Longest nap between looks without queue descriptors (an idle rank then wakes 1000 times
/// a second).
const NAP_MAX: Duration = Duration::from_millis(1);
/// How often the progress thread first looks whether the engine still polls, while it does
/// (with manual progress, a peer's writes move only while somebody reads our queue: an engine
/// busy elsewhere leaves them to the thread after [`crate::handback::ENGINE_GRACE`] and this;
/// so does libfabric 2.x's `tcp`, which reports automatic progress but, with a wait object on
/// the queue, ran no thread of its own in a profile of a ping-pong).
const ENGINE_RECHECK: Duration = Duration::from_millis(1);
/// Longest interval between those looks: each one that finds the engine still polling
/// doubles it, up to this. Every look wakes the thread, which then takes the core from an
/// engine thread pinned to the same one (about 30 µs a time; at one look a millisecond, 5 %
/// of an 8-byte ping-pong's time: docs/TUNING.md); an engine that stops polling without
/// handing the queue back (busy in a long task) leaves it unread for at most this long.
const ENGINE_RECHECK_MAX: Duration = Duration::from_millis(8);

/// Blocks until one of `fds` is readable or `timeout` passes (an error of `poll` only ends the
/// wait early: the loop around it looks again).
fn block(fds: &[i32], timeout: Duration) {
    let _ = poll_readable(fds, timeout);
}

/// Blocks until one of the completion queues' descriptors `cqs` (or of `also`) is readable or
/// `timeout` passes; without queue descriptors the provider moves only when polled, so the
/// wait ends after `nap` at the latest.
pub(super) fn block_on_queue(cqs: &[i32], also: &[i32], timeout: Duration, nap: Duration) {
    if cqs.is_empty() {
        block(also, timeout.min(nap));
    } else {
        block(&[cqs, also].concat(), timeout);
    }
}

/// Drives the endpoint while the engine does not: reads completions (so that peers' writes
/// land and the engine's waiters wake: it rings the doorbell when something arrived) and
/// otherwise blocks on the completion queue's descriptor and the engine's [`crate::handback::Handback`]. While
/// the engine polls the endpoint itself, or anyone holds the state's lock (the engine inside a
/// long call: a large `fi_writedata` is one `sendmsg` of hundreds of microseconds with socket
/// providers), the thread leaves the queue alone and waits for the engine's word: contending
/// for the lock would only trade the endpoint between two threads on a small host. Either way
/// it sends the liveness messages. Ends once the device drops (`stop`, then the word: read
/// after the word is taken, so neither is missed).
pub(super) fn progress_thread(d: Arc<Shared>) {
    let mut last_ping = Instant::now();
    let mut recheck = ENGINE_RECHECK;
    let mut nap = NAP_MIN;
    loop {
        d.handback.take();
        if d.stop.load(Ordering::Acquire) {
            return;
        }
        let ping = last_ping.elapsed() >= PING_EVERY;
        let engine = d.polled.recent();
        let state = if engine && !ping { None } else { d.try_lock() };
        let (any, may_block, busy) = match state {
            None => (false, true, true),
            Some(mut s) => {
                let any = !engine && s.progress_all();
                if ping {
                    last_ping = Instant::now();
                    for peer in (0..s.peers.len()).filter(|&p| p != d.rank) {
                        if s.peer(peer).dead.is_none()
                            && let Err(why) =
                                s.send(peer, &Header::new(Kind::Ping, 0, 0, 0, 0), &[])
                        {
                            s.peer(peer).kill(format!("is unreachable: {why}"));
                        }
                    }
                }
                (any, engine || (!any && s.ep.trywait()), engine)
            }
        };
        if any {
            d.bell.ring();
        }
        let word = d.handback.fd();
        if !busy {
            recheck = ENGINE_RECHECK;
        }
        if any || busy {
            nap = NAP_MIN;
        }
        if may_block {
            if busy {
                block(&[word], recheck);
                recheck = (recheck * 2).min(ENGINE_RECHECK_MAX);
            } else {
                block_on_queue(&d.wait_fds, &[word], IDLE_WAIT, nap);
                nap = (nap * 2).min(NAP_MAX);
            }
        }
    }
}
