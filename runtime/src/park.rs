//! Parked work: the tasks of an operation held for the thread that is about to wait for them.
//!
//! The C ABI enqueues (`ampcclAllReduce`) and waits (`ampcclStreamSynchronize`) in two calls.
//! Queueing an operation's tasks for the engine costs a queue round trip per task and a
//! wake-up of the background thread: the microseconds a small message's latency is made of. A
//! caller that expects to wait soon makes the stream *parking* for the operation
//! ([`Stream::park_while_idle`]: only an idle stream, only an algorithm whose tasks all go to
//! that stream). Its tasks are counted as enqueued (events recorded after them cover them) but
//! held in the stream's `parked` list, out of the queue the engine drives, and nobody is woken.
//! Until one is held, each task is polled once as it comes, as an inline stream would: what can
//! finish at once (a send into a free slot) does, so the peer gets it as early as from a
//! blocking call.
//!
//! Whoever holds the `parked` lock owns the tasks, one owner at a time:
//! - a waiter whose event covers them ([`Event::wait`](crate::stream::Event::wait)) runs them
//!   on its own thread, in order, as an inline stream would (polled, backing off, timing out;
//!   the engine's other streams progress meanwhile), holding the lock until they are done so
//!   that nothing is enqueued behind them meanwhile; parked tasks after its event go to the
//!   queue;
//! - [`Stream::unpark`] moves them to the queue (they are the stream's whole backlog: it was
//!   idle) and kicks the engine, for callers that will not wait for them (a future's poll, a
//!   query, the next operation of the communicator on another stream, the C ABI before it
//!   waits for other work or on any other call); it leaves tasks a waiter is running to it.
//!   Enqueueing other work on the stream moves them first too, waiting for a running waiter
//!   to finish, so nothing overtakes them;
//! - the engine's background thread, *watching* while parking goes on, moves tasks parked for
//!   more than a tick ([`WATCH_TICK`], longer while waiters claim everything) to the queue and
//!   drives them: work nobody waits for still runs, a tick or two late (2 to 16 ms).
//!
//! Parking wakes nobody. The watching background thread sleeps a tick at a time on the
//! engine's private kick bell, which peers do not ring. It starts watching when parking starts
//! ([`EngineInner::note_parked`] kicks it only if it is not watching already) and stops
//! [`WATCH_LINGER`] ticks after the last park. The hand-over is Dekker's pattern on `parks` and
//! `watching` (both sides read-modify-write `parks`, modelled under loom below): either the
//! watcher sees the new park, or the parker sees that it stopped and rings the kick bell, which
//! ends the sleep the watcher is about to start.
//!
//! A parked task that fails fails its stream (sticky, like any task) and aborts the engine, as
//! the engine does when a queued task fails; an abort fails parked tasks nobody is running, and
//! [`Engine::abort`](crate::engine::Engine::abort) waits (up to its 2 s bound) for waiters
//! running parked tasks to see it and stop, so that no task touches the application's buffers
//! after it returns, as for queued tasks.

// Under loom the engine's background thread, the watcher's only caller, is not built.
#![cfg_attr(ampccl_loom, allow(dead_code))]

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::engine::{EngineInner, MAX_SLEEP};
use crate::error::Error;
use crate::stream::{Queued, Stream, StreamInner, lock, run_to_end};
use crate::sync::{MutexGuard, Ordering};
use crate::task::Task;

/// How often a watching background thread looks at parked work; work parked for more than one
/// tick (so between one and two) goes to the queue. While waiters claim all parked work, the
/// tick doubles up to [`WATCH_TICK_MAX`]; it is back to this once work had to be taken over.
pub const WATCH_TICK: Duration = Duration::from_millis(1);
/// Longest tick of a watching background thread.
pub const WATCH_TICK_MAX: Duration = Duration::from_millis(8);
/// Ticks without a new park after which the background thread stops watching.
pub const WATCH_LINGER: u32 = 100;

/// The tasks a stream holds for a waiter.
#[derive(Default)]
pub(crate) struct Parked {
    tasks: VecDeque<Task>,
    /// Engine tick at which the first of `tasks` was parked.
    tick: u64,
}

/// A stream parking until dropped (see [`Stream::park_while_idle`]).
pub struct ParkGuard<'a> {
    stream: &'a Stream,
}

impl Drop for ParkGuard<'_> {
    fn drop(&mut self) {
        let s = self.stream;
        s.inner.parking.store(false, Ordering::Relaxed);
        if s.inner.has_parked.load(Ordering::Acquire) {
            s.engine.note_parked();
        }
    }
}

impl Stream {
    /// Makes the stream parking until the guard drops, if it is idle (everything enqueued has
    /// completed, nothing failed, nothing parked); `None` otherwise. While parking,
    /// [`Stream::enqueue`] holds tasks for a waiter (see the module documentation).
    ///
    /// As for [`Stream::inline_while_idle`]: only for the stream's sole user meanwhile, and
    /// only for operations whose tasks all go to this stream.
    pub fn park_while_idle(&self) -> Option<ParkGuard<'_>> {
        let inner = &*self.inner;
        let idle = !inner.failed.load(Ordering::Acquire)
            && !inner.has_parked.load(Ordering::Acquire)
            && inner.completed.load(Ordering::Acquire) == inner.enqueued.load(Ordering::Acquire);
        idle.then(|| {
            inner.parking.store(true, Ordering::Relaxed);
            ParkGuard { stream: self }
        })
    }

    /// Holds `task` for a waiter (the stream is parking). Until one is held, tasks are polled
    /// once first, as an inline stream would: what can finish at once (a send into a free
    /// slot) does, so the peer gets it as early as from a blocking call.
    pub(crate) fn park(&self, mut task: Task) {
        let inner = &*self.inner;
        let mut p = lock(&inner.parked);
        inner.enqueued.fetch_add(1, Ordering::AcqRel);
        if inner.failed.load(Ordering::Acquire) {
            inner.completed.fetch_add(1, Ordering::Release);
            return;
        }
        if p.tasks.is_empty() {
            match task.poll() {
                Poll::Ready(Ok(())) => {
                    inner.completed.fetch_add(1, Ordering::Release);
                    return;
                }
                Poll::Ready(Err(e)) => {
                    // As a queued task's failure (see `run_parked`).
                    inner.record_failure(e.clone());
                    inner.completed.fetch_add(1, Ordering::Release);
                    drop(p);
                    self.engine.abort_with(e);
                    return;
                }
                Poll::Pending => {}
            }
            p.tick = self.engine.tick.load(Ordering::Relaxed);
            inner.has_parked.store(true, Ordering::Release);
        }
        p.tasks.push_back(task);
    }

    /// Hands the parked tasks, if any, to the engine (the queue) and kicks it; returns whether
    /// there were any. Tasks a waiter is running are left to it (they progress).
    pub fn unpark(&self) -> bool {
        unpark(&self.inner, &self.engine, false)
    }

    /// True while tasks are parked on this stream.
    pub fn has_parked(&self) -> bool {
        self.inner.has_parked.load(Ordering::Acquire)
    }
}

/// Moves `p`'s tasks to the (empty) queue of `s`; returns how many.
fn to_queue(s: &StreamInner, engine: &EngineInner, p: &mut MutexGuard<'_, Parked>) -> u64 {
    let n = p.tasks.len() as u64;
    if n > 0 {
        let mut q = lock(&s.queue);
        q.extend(p.tasks.drain(..).map(Queued::new));
        engine.pending.fetch_add(n, Ordering::AcqRel);
    }
    s.has_parked.store(false, Ordering::Release);
    n
}

/// [`Stream::unpark`] on the parts of a stream; `block`: wait for a running waiter (else leave
/// the tasks to it).
pub(crate) fn unpark(s: &StreamInner, engine: &Arc<EngineInner>, block: bool) -> bool {
    if !s.has_parked.load(Ordering::Acquire) {
        return false;
    }
    let mut p = if block {
        lock(&s.parked)
    } else {
        match s.parked.try_lock() {
            Ok(p) => p,
            Err(_) => return false,
        }
    };
    let n = to_queue(s, engine, &mut p);
    drop(p);
    if n > 0 {
        engine.kick();
    }
    n > 0
}

/// Runs the tasks parked on `s` up to position `upto` on this thread (see the module
/// documentation); the ones after it go to the queue.
pub(crate) fn run_parked(s: &StreamInner, engine: &Arc<EngineInner>, upto: u64) {
    /// Counts this waiter in `runners` while it lives.
    struct Running<'a>(&'a EngineInner);
    impl Drop for Running<'_> {
        fn drop(&mut self) {
            self.0.runners.fetch_sub(1, Ordering::AcqRel);
        }
    }
    engine.runners.fetch_add(1, Ordering::AcqRel);
    let _running = Running(engine);
    let mut p = lock(&s.parked);
    while s.completed.load(Ordering::Acquire) < upto {
        let Some(task) = p.tasks.pop_front() else {
            break;
        };
        if let Err(e) = run_to_end(engine, task) {
            // As a queued task's failure: the stream fails (with everything after the task),
            // and so does the engine.
            let dropped = p.tasks.len() as u64 + 1;
            p.tasks.clear();
            s.has_parked.store(false, Ordering::Release);
            s.record_failure(e.clone());
            s.completed.fetch_add(dropped, Ordering::Release);
            drop(p);
            engine.abort_with(e);
            return;
        }
        s.completed.fetch_add(1, Ordering::Release);
    }
    if to_queue(s, engine, &mut p) > 0 {
        drop(p);
        engine.kick();
    }
}

impl StreamInner {
    /// Fails the parked tasks unless a waiter is running them (it sees the abort itself).
    pub(crate) fn fail_parked(&self, e: &Error) {
        if !self.has_parked.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut p) = self.parked.try_lock() else {
            return;
        };
        let n = p.tasks.len() as u64;
        p.tasks.clear();
        self.has_parked.store(false, Ordering::Release);
        if n > 0 {
            self.record_failure(e.clone());
            self.completed.fetch_add(n, Ordering::Release);
        }
    }
}

/// The background thread's view of parking.
#[derive(Default)]
pub(crate) struct Watch {
    /// `parks` at the last look.
    parks: u64,
    /// Ticks since the last new park.
    quiet: u32,
    /// When the next tick is due.
    next: Option<Instant>,
    /// The current tick's length (see [`WATCH_TICK`]).
    len: Duration,
}

impl EngineInner {
    /// Parking happened on a stream of this engine: makes sure the background thread watches.
    pub(crate) fn note_parked(self: &Arc<Self>) {
        self.parks.fetch_add(1, Ordering::SeqCst);
        if !self.watching.load(Ordering::SeqCst) {
            self.kick();
        }
    }

    /// The background thread's look at parked work, on every turn of its loop: once a tick,
    /// moves work parked for more than a tick to the queue. Returns how long the thread may
    /// sleep when it has nothing to drive.
    pub(crate) fn watch(&self, w: &mut Watch) -> Duration {
        let parks = self.parks.load(Ordering::SeqCst);
        if parks != w.parks {
            w.parks = parks;
            w.quiet = 0;
            self.watching.store(true, Ordering::SeqCst);
        }
        if !self.watching.load(Ordering::Relaxed) {
            return MAX_SLEEP;
        }
        let now = Instant::now();
        if let Some(t) = w.next
            && now < t
        {
            return t - now;
        }
        let tick = self.tick.fetch_add(1, Ordering::Relaxed) + 1;
        let f = self.flush_stale(tick);
        w.len = f.next_tick(w.len);
        w.next = Some(now + w.len);
        w.quiet = w.quiet.saturating_add(1);
        if w.quiet > WATCH_LINGER && !f.unclaimed && !f.claimed && self.stop_watching(w.parks) {
            w.next = None;
            w.len = WATCH_TICK;
            return MAX_SLEEP;
        }
        w.len
    }

    /// Stops watching unless a park came after `seen` (the watcher's half of the hand-over).
    pub(crate) fn stop_watching(&self, seen: u64) -> bool {
        self.watching.store(false, Ordering::SeqCst);
        // A read-modify-write, not a load: ordered with the parker's increment in `parks`'s
        // modification order, so either it reads the park or the parker reads `watching`
        // false (Dekker's pattern without relying on SeqCst loads, which loom does not model).
        if self.parks.fetch_add(0, Ordering::SeqCst) != seen {
            self.watching.store(true, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Moves work parked before tick `tick - 1` to the queues and says what it saw.
    pub(crate) fn flush_stale(&self, tick: u64) -> Flushed {
        let mut f = Flushed::default();
        let Ok(streams) = self.streams.try_lock() else {
            f.unclaimed = true;
            return f;
        };
        for s in streams.iter() {
            if !s.has_parked.load(Ordering::Acquire) {
                continue;
            }
            let Ok(mut p) = s.parked.try_lock() else {
                // A waiter runs this stream's parked work.
                f.claimed = true;
                continue;
            };
            if p.tasks.is_empty() {
                continue;
            }
            if p.tick + 2 <= tick {
                f.moved |= to_queue(s, self, &mut p) > 0;
            } else {
                f.unclaimed = true;
            }
        }
        f
    }
}

/// What one look of the watcher ([`EngineInner::flush_stale`]) found.
#[derive(Default)]
pub(crate) struct Flushed {
    /// Stale parked work went to the queues.
    moved: bool,
    /// Parked work nobody runs is not stale yet, or the streams could not be looked at.
    unclaimed: bool,
    /// Waiters run parked work.
    claimed: bool,
}

impl Flushed {
    /// The next tick's length after a look that found this, the last tick `len` long.
    fn next_tick(&self, len: Duration) -> Duration {
        if self.moved {
            WATCH_TICK
        } else if self.unclaimed {
            len.max(WATCH_TICK)
        } else {
            // Waiters run everything parked (or nothing is): look less often. Each look takes
            // the core from them, and a waiter blocked on a late peer would pay a wake-up a
            // tick for as long as it waits.
            (len * 2).clamp(WATCH_TICK, WATCH_TICK_MAX)
        }
    }
}

#[cfg(all(test, not(ampccl_loom)))]
mod tests {
    use super::*;

    fn look(moved: bool, unclaimed: bool, claimed: bool, len: Duration) -> Duration {
        Flushed {
            moved,
            unclaimed,
            claimed,
        }
        .next_tick(len)
    }

    /// The watcher looks less often while waiters run the parked work (a waiter blocked on a
    /// late peer would otherwise pay a wake-up every millisecond), keeps its pace while
    /// parked work nobody runs waits to become stale, and looks every tick again once it had
    /// to move some.
    #[test]
    fn the_watch_backs_off_while_waiters_run_the_parked_work() {
        let mut len = WATCH_TICK;
        let mut lens = Vec::new();
        for _ in 0..6 {
            len = look(false, false, true, len);
            lens.push(len);
        }
        assert_eq!(lens[0], 2 * WATCH_TICK);
        assert_eq!(len, WATCH_TICK_MAX);
        assert!(lens.windows(2).all(|p| p[0] <= p[1]));
        assert_eq!(look(false, true, true, WATCH_TICK_MAX), WATCH_TICK_MAX);
        assert_eq!(look(false, true, false, WATCH_TICK), WATCH_TICK);
        assert_eq!(look(true, true, true, WATCH_TICK_MAX), WATCH_TICK);
        assert_eq!(look(false, false, false, WATCH_TICK), 2 * WATCH_TICK);
    }
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use super::*;
    use crate::doorbell::Doorbell;
    use crate::engine::Engine;
    use crate::sync::AtomicUsize;
    use std::task::Poll;

    /// A waiter runs parked tasks while the watcher hands them to the queue and drives it:
    /// every task runs exactly once, in order, and the event reports success.
    #[test]
    fn waiter_and_watcher_claim_parked_work_once() {
        loom::model(|| {
            let e = Engine::new(Doorbell::new(), Duration::from_secs(3600));
            let s = e.stream();
            let step = Arc::new(crate::sync::Arc::new(AtomicUsize::new(0)));
            {
                let _g = s.park_while_idle().expect("idle");
                for want in 0..2usize {
                    let st = step.clone();
                    // The first poll (at park time) finds it not ready: it stays parked.
                    let mut polled = false;
                    // SAFETY: no pointers.
                    unsafe {
                        s.enqueue(Task::Callback(Box::new(move || {
                            if !std::mem::replace(&mut polled, true) {
                                return Poll::Pending;
                            }
                            assert_eq!(st.fetch_add(1, Ordering::SeqCst), want, "order");
                            Poll::Ready(Ok(()))
                        })))
                    };
                }
            }
            assert!(s.has_parked());
            let ev = s.record();
            let (s2, ev2) = (s.clone(), ev.clone());
            let watcher = loom::thread::spawn(move || {
                s2.engine.flush_stale(u64::MAX);
                while !ev2.is_done() {
                    s2.inner.advance(Duration::from_secs(3600));
                    loom::thread::yield_now();
                }
            });
            run_parked(&s.inner, &s.engine, ev.seq());
            while !ev.is_done() {
                loom::thread::yield_now();
            }
            watcher.join().unwrap();
            assert_eq!(step.load(Ordering::SeqCst), 2);
            assert!(matches!(ev.status(), Some(Ok(()))));
            assert!(!s.has_parked());
        });
    }

    /// A park while the watcher stops watching is never missed: either the watcher sees it,
    /// or its sleep on the kick bell ends.
    #[test]
    fn watch_hand_over_loses_no_park() {
        loom::model(|| {
            let e = Engine::new(Doorbell::new(), Duration::from_secs(3600));
            let s = e.stream();
            let eng = s.engine.clone();
            let seen = eng.parks.load(Ordering::SeqCst);
            eng.watching.store(true, Ordering::SeqCst);
            let e2 = eng.clone();
            let parker = loom::thread::spawn(move || e2.note_parked());
            loop {
                let kicked = eng.kick_bell.seq();
                if !eng.stop_watching(seen) {
                    break;
                }
                if eng.parks.load(Ordering::SeqCst) != seen {
                    break;
                }
                eng.kick_bell.sleep(kicked, Duration::from_secs(1));
            }
            parker.join().unwrap();
        });
    }
}
