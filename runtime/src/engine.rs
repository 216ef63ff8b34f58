//! The engine: drives the streams of one communicator.
//!
//! Progress is made by whichever thread holds the driver role (a `try_lock`): a thread waiting
//! on an event drives inline (MPI style — no hand-off latency for blocking calls), and a
//! background thread, started only when work is left to run unawaited (`EngineInner::kick` or an
//! awaited future that could not finish inline), drives while no foreground thread waits.
//! Idle drivers spin briefly, then yield, then sleep on the engine's [`Doorbell`], which peers
//! ring when they write to us; so an oversubscribed machine is not burnt by spinning.
//!
//! The background thread sleeps on a private *kick bell* instead while it has nothing to drive:
//! kicks ring it, peers' messages do not, so a peer pays no futex wake-up for a thread that
//! would only go back to sleep. (While it stands back for a waiter with work queued it sleeps
//! on the doorbell, and so resumes as soon as the waiter leaves work behind.) While streams
//! park work for waiters it also *watches* them, waking every tick to hand work left parked
//! to the queue (see [`crate::park`]).

use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::doorbell::Doorbell;
use crate::error::Error;
use crate::notify::Notify;
use crate::stream::{Stream, StreamInner, lock};
use std::sync::Arc;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, spin_hint};

/// How long an idle driver spins (by default), then yields its core, before it sleeps on the
/// doorbell. Sleeping costs a futex wake-up (tens of µs) on the next message, so ranks that
/// wait for each other in lock step must not fall asleep between operations; yielding keeps an
/// oversubscribed machine (more ranks than cores) usable meanwhile — there the spin phase
/// only delays the peer that shares our core, and [`Engine::set_spin`] turns it off.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(5);
const YIELD: Duration = Duration::from_millis(2);
/// Longest sleep of an idle driver (bounds how late timeouts and health checks run).
pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(20);

pub(crate) struct EngineInner {
    /// The driver role and the list of streams.
    pub(crate) streams: Mutex<Vec<Arc<StreamInner>>>,
    pub(crate) bell: Doorbell,
    /// Tasks enqueued and not yet finished, over all streams.
    pub(crate) pending: AtomicU64,
    /// Threads blocked in a wait (the background thread stands back while > 0).
    waiters: AtomicUsize,
    /// Busy-spin phase of idle drivers, in nanoseconds.
    spin_ns: AtomicU64,
    timeout: Duration,
    abort: Mutex<Option<Error>>,
    aborted: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
    has_wakers: AtomicBool,
    background: Mutex<Option<JoinHandle<()>>>,
    stop: AtomicBool,
    /// Called by a driver whose pass made no progress (see [`Engine::set_idle_hook`]).
    idle_hook: std::sync::OnceLock<IdleHook>,
    /// Called once, at the engine's first abort (see [`Engine::set_abort_hook`]).
    abort_hook: std::sync::OnceLock<AbortHook>,
    /// What the background thread sleeps on when it has nothing to drive (rung by kicks).
    pub(crate) kick_bell: Doorbell,
    /// Parking operations so far (see [`crate::park`]).
    pub(crate) parks: AtomicU64,
    /// The background thread watches parked work (see [`crate::park`]).
    pub(crate) watching: AtomicBool,
    /// Ticks of the watching background thread; parked work is stamped with it.
    pub(crate) tick: AtomicU64,
    /// Waiters running parked work (see [`crate::park`]; [`Engine::abort`] waits for them).
    pub(crate) runners: AtomicUsize,
}

/// What an idle driver calls (a transport's flush of coalesced frames).
/// See [`Engine::set_idle_hook`]; the argument is true when the driver is about to sleep.
pub type IdleHook = Box<dyn Fn(bool) + Send + Sync>;

/// What the engine calls at its first abort, with the reason (see [`Engine::set_abort_hook`]).
pub type AbortHook = Box<dyn Fn(&Error) + Send + Sync>;

/// Owner handle of an engine; dropping it stops the background thread.
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl Engine {
    /// A new engine whose waits fail after `timeout`, sleeping on `bell` when idle.
    pub fn new(bell: Doorbell, timeout: Duration) -> Engine {
        Engine {
            inner: Arc::new(EngineInner {
                streams: Mutex::new(Vec::new()),
                bell,
                pending: AtomicU64::new(0),
                waiters: AtomicUsize::new(0),
                spin_ns: AtomicU64::new(DEFAULT_SPIN.as_nanos() as u64),
                timeout,
                abort: Mutex::new(None),
                aborted: AtomicBool::new(false),
                wakers: Mutex::new(Vec::new()),
                has_wakers: AtomicBool::new(false),
                background: Mutex::new(None),
                stop: AtomicBool::new(false),
                idle_hook: std::sync::OnceLock::new(),
                abort_hook: std::sync::OnceLock::new(),
                kick_bell: Doorbell::new(),
                parks: AtomicU64::new(0),
                watching: AtomicBool::new(false),
                tick: AtomicU64::new(0),
                runners: AtomicUsize::new(0),
            }),
        }
    }

    /// A new stream driven by this engine.
    pub fn stream(&self) -> Stream {
        let s = Arc::new(StreamInner::new());
        lock(&self.inner.streams).push(s.clone());
        Stream {
            inner: s,
            engine: self.inner.clone(),
        }
    }

    /// A notify waited on by streams of this engine.
    pub fn notify(&self) -> Notify {
        Notify::new(self.inner.bell.clone())
    }

    /// The doorbell peers ring to wake this engine.
    pub fn doorbell(&self) -> &Doorbell {
        &self.inner.bell
    }

    /// Sets how long idle drivers spin before they yield (zero: yield at once, for
    /// oversubscribed machines).
    pub fn set_spin(&self, spin: Duration) {
        self.inner.spin_ns.store(
            spin.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Sets (once) what a driver calls when a pass over the streams made no progress, before
    /// it spins or yields (`false`), and right before it sleeps on the doorbell after its last
    /// look (`true`): a transport that holds small frames back to send them together flushes
    /// them there, so nothing waits on a frame its sender sits on; one whose receiving thread
    /// stands back while the engine polls hands it the connections back before the sleep, so
    /// that what arrives next rings the doorbell.
    pub fn set_idle_hook(&self, hook: IdleHook) {
        let _ = self.inner.idle_hook.set(hook);
    }

    /// Sets the hook the engine calls at its first abort, whatever caused it: a task that
    /// failed (a queued or parked one; the first failure fails the engine), or [`Engine::abort`].
    /// It runs on the thread that aborts, outside the streams' lock, before the abort shows
    /// (the other streams' work fails, their waiters wake, a concurrent abort returns); the
    /// failed task's own stream has recorded its error already. A communicator marks itself
    /// failed there, so that its transport closes the memory peers could still write into and
    /// tells the peers, also for callers that never look at the operation's result (the C
    /// ABI's streams). A second call is ignored.
    pub fn set_abort_hook(&self, hook: AbortHook) {
        let _ = self.inner.abort_hook.set(hook);
    }

    /// Fails all queued and future work with `reason` and wakes every waiter.
    ///
    /// When it returns, no task of this engine is running or will run any more (unless called
    /// from inside a task, where it cannot wait for the pass it is part of): the memory the
    /// tasks pointed to may be handed back to the application.
    pub fn abort(&self, reason: Error) {
        self.inner.abort_with(reason);
        let t0 = Instant::now();
        loop {
            // A pass in progress on another thread ends soon; the next one drains the queues.
            if let Ok(streams) = self.inner.streams.try_lock() {
                drop(streams);
                self.inner.try_progress();
                break;
            }
            if t0.elapsed() > Duration::from_secs(2) {
                return;
            }
            crate::sync::thread::yield_now();
        }
        // Waiters running parked work see the abort at their next poll and stop.
        while self.inner.runners.load(Ordering::Acquire) > 0 {
            if t0.elapsed() > Duration::from_secs(2) {
                return;
            }
            crate::sync::thread::yield_now();
        }
    }

    /// The abort reason, if aborted.
    pub fn abort_reason(&self) -> Option<Error> {
        self.inner.aborted()
    }

    /// Drives until `done` returns `Some` (used by blocking calls that need a condition other
    /// than an event).
    pub fn wait_until<T>(&self, done: impl FnMut() -> Option<T>) -> T {
        self.inner.wait_until(done)
    }

    /// Configured wait timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.kick_bell.ring();
        self.inner.bell.ring();
        if let Some(h) = lock(&self.inner.background).take() {
            let _ = h.join();
        }
    }
}

impl EngineInner {
    /// The abort reason once aborted (cheap while not: one flag load).
    pub(crate) fn aborted(&self) -> Option<Error> {
        if !self.aborted.load(Ordering::Acquire) {
            return None;
        }
        Some(
            lock(&self.abort)
                .clone()
                .unwrap_or(Error::Aborted(String::new())),
        )
    }

    /// The wait timeout of tasks.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One progress pass if no other thread is driving. Returns true if anything finished.
    pub(crate) fn try_progress(&self) -> bool {
        let Ok(streams) = self.streams.try_lock() else {
            return false;
        };
        if let Some(reason) = self.aborted() {
            let n: u64 = streams.iter().map(|s| s.fail_all(reason.clone())).sum();
            self.finished(n);
            return n > 0;
        }
        let mut finished = 0;
        let mut failure = None;
        for s in streams.iter() {
            let (n, failed) = s.advance(self.timeout);
            finished += n;
            let Some(e) = failed else { continue };
            failure.get_or_insert(e);
            if tracing::enabled!(tracing::Level::DEBUG) {
                // What every other stream was waiting for: the cause of a timeout is often
                // another stream's stuck task.
                for (i, other) in streams.iter().enumerate() {
                    if let Some(head) = other.head() {
                        tracing::debug!("stream {i} waits on {head}");
                    }
                }
            }
        }
        drop(streams);
        if let Some(e) = failure {
            // The streams of an engine work on the same operations: a task of another stream
            // may wait for a notify the failed stream would have recorded, and would wait
            // until its timeout without saying why. The first failure fails them all (after
            // the streams' lock is released: the abort hook may take a while).
            self.abort_with(e);
        }
        self.finished(finished);
        finished > 0
    }

    fn finished(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.pending.fetch_sub(n, Ordering::AcqRel);
        if self.has_wakers.load(Ordering::Acquire) {
            self.has_wakers.store(false, Ordering::Release);
            for w in std::mem::take(&mut *lock(&self.wakers)) {
                w.wake();
            }
        }
        if self.waiters.load(Ordering::Acquire) > 0 {
            // A waiter may be asleep while another thread drives.
            self.bell.ring();
        }
    }

    pub(crate) fn wait_until<T>(&self, mut done: impl FnMut() -> Option<T>) -> T {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let mut backoff = Backoff::new(self.spin());
        let out = loop {
            let progressed = self.try_progress();
            if let Some(r) = done() {
                break r;
            }
            if progressed {
                backoff = Backoff::new(self.spin());
            } else if self.idle(&mut backoff) {
                // Read the doorbell only now (peers ring it on every message; reading it in
                // the hot loop would bounce its cache line), then look once more: anything
                // that arrives after this read rings it and ends the sleep.
                let seen = self.bell.seq();
                if self.try_progress() {
                    backoff = Backoff::new(self.spin());
                    continue;
                }
                if let Some(r) = done() {
                    break r;
                }
                self.sleeping();
                backoff.sleep(&self.bell, seen);
            }
        };
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        out
    }

    /// An idle driver's step: the idle hook, then `backoff`'s pause; true once it should sleep.
    fn idle(&self, backoff: &mut Backoff) -> bool {
        if let Some(hook) = self.idle_hook.get() {
            hook(false);
        }
        backoff.pause()
    }

    /// A driver's last step before it sleeps on the doorbell (after its last look).
    fn sleeping(&self) {
        if let Some(hook) = self.idle_hook.get() {
            hook(true);
        }
    }

    fn spin(&self) -> Duration {
        Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn register_waker(self: &Arc<Self>, waker: &Waker) {
        {
            let mut w = lock(&self.wakers);
            if !w.iter().any(|x| x.will_wake(waker)) {
                w.push(waker.clone());
            }
        }
        self.has_wakers.store(true, Ordering::Release);
        self.kick();
    }

    pub(crate) fn kick(self: &Arc<Self>) {
        #[cfg(not(ampccl_loom))]
        self.start_background();
        self.kick_bell.ring();
        self.bell.ring();
    }

    /// Starts the background driver once (not under loom: models drive explicitly).
    #[cfg(not(ampccl_loom))]
    fn start_background(self: &Arc<Self>) {
        let mut bg = lock(&self.background);
        if bg.is_none() && !self.stop.load(Ordering::Acquire) {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("ampccl-progress".into())
                .spawn(move || me.background_loop());
            match spawned {
                Ok(h) => *bg = Some(h),
                Err(e) => tracing::error!("cannot start the progress thread: {e}"),
            }
        }
    }

    #[cfg(not(ampccl_loom))]
    fn background_loop(self: Arc<Self>) {
        let mut backoff = Backoff::new(self.spin());
        let mut watch = crate::park::Watch::default();
        while !self.stop.load(Ordering::Acquire) {
            let seen = self.bell.seq();
            // Read before `watch` looks at the parks: a park after that look rings it.
            let kicked = self.kick_bell.seq();
            let nap = self.watch(&mut watch);
            let work =
                self.pending.load(Ordering::Acquire) > 0 || self.has_wakers.load(Ordering::Acquire);
            if !work {
                // Nothing to drive: only a kick (or the watch's next tick) brings work.
                self.kick_bell.sleep(kicked, nap);
                continue;
            }
            if self.waiters.load(Ordering::Acquire) > 0 {
                // Standing back for a waiter: peers' messages wake us to look again, so that
                // work the waiter leaves behind goes on at once.
                self.bell.sleep(seen, nap);
                continue;
            }
            if self.try_progress() {
                backoff = Backoff::new(self.spin());
            } else if self.idle(&mut backoff) {
                self.sleeping();
                backoff.sleep(&self.bell, seen);
            }
        }
    }

    /// Aborts with `reason` unless aborted already. The first abort runs the abort hook before
    /// the abort shows: under the reason's lock, so that a concurrent abort waits for the hook
    /// too (readers of the reason take the lock only once the flag is set, after it).
    pub(crate) fn abort_with(&self, reason: Error) {
        let mut a = lock(&self.abort);
        if a.is_none() {
            if let Some(hook) = self.abort_hook.get() {
                hook(&reason);
            }
            *a = Some(reason);
        }
        drop(a);
        self.aborted.store(true, Ordering::Release);
        self.kick_bell.ring();
        self.bell.ring();
    }
}

/// Back-off of an idle driver: spin, then yield, then sleep on the doorbell until rung.
struct Backoff {
    spin: Duration,
    polls: u32,
    since: Option<Instant>,
    /// The spin phase is over (the driver yields and reads the clock on every pause).
    spun: bool,
    naps: u32,
}

impl Backoff {
    fn new(spin: Duration) -> Backoff {
        Backoff {
            spin,
            polls: 0,
            since: None,
            spun: false,
            naps: 0,
        }
    }

    /// Idle polls before the clock is read at all (a poll costs far less than a clock read).
    const FREE_SPINS: u32 = 64;
    /// After those, spinning polls per clock reading.
    const SPINS_PER_READ: u32 = 8;

    /// Spins or yields; returns true once the driver has been idle long enough to sleep.
    fn pause(&mut self) -> bool {
        self.polls = self.polls.saturating_add(1);
        let spinning = !self.spin.is_zero() && !self.spun;
        if spinning
            && (self.polls < Self::FREE_SPINS || !self.polls.is_multiple_of(Self::SPINS_PER_READ))
        {
            spin_hint();
            return false;
        }
        let idle = self.since.get_or_insert_with(Instant::now).elapsed();
        if idle < self.spin {
            spin_hint();
        } else if idle < YIELD {
            self.spun = true;
            crate::sync::thread::yield_now();
        } else {
            return true;
        }
        false
    }

    /// Sleeps until the doorbell moves past `seen` (each nap up to twice as long as the last).
    fn sleep(&mut self, bell: &Doorbell, seen: u32) {
        let ms = 1u64 << self.naps.min(5);
        self.naps += 1;
        bell.sleep(seen, Duration::from_millis(ms).min(MAX_SLEEP));
    }
}

#[cfg(all(test, not(ampccl_loom)))]
mod tests {
    use super::*;
    use crate::task::CopyTo;
    use crate::task::Task;
    use std::task::Poll;

    fn engine() -> Engine {
        Engine::new(Doorbell::new(), Duration::from_secs(5))
    }

    #[test]
    fn tasks_on_a_stream_run_in_order() {
        let e = engine();
        let s = e.stream();
        let mut a = [1u8; 64];
        let mut b = [0u8; 64];
        let mut c = [0u8; 64];
        // SAFETY: the buffers outlive the synchronize below.
        unsafe {
            s.enqueue(Task::Copy {
                dst: b.as_mut_ptr(),
                src: a.as_ptr(),
                len: 64,
                to: CopyTo::Local,
            });
            s.enqueue(Task::Copy {
                dst: c.as_mut_ptr(),
                src: b.as_ptr(),
                len: 64,
                to: CopyTo::Local,
            });
        }
        s.synchronize().unwrap();
        assert_eq!(c, [1u8; 64]);
        a[0] = 9;
        assert_eq!(a[0], 9);
    }

    #[test]
    fn notify_orders_two_streams_and_background_thread_runs_unawaited_work() {
        let e = engine();
        let (main, side) = (e.stream(), e.stream());
        let n = e.notify();
        let src = vec![7u32; 1000];
        let mut mid = vec![0u32; 1000];
        let mut dst = vec![0u32; 1000];
        // SAFETY: buffers live until the final synchronize.
        unsafe {
            let target = n.next_wait();
            main.enqueue(Task::Wait {
                notify: n.clone(),
                target,
            });
            main.enqueue(Task::Copy {
                dst: dst.as_mut_ptr().cast(),
                src: mid.as_ptr().cast(),
                len: 4000,
                to: CopyTo::Local,
            });
            side.enqueue(Task::Copy {
                dst: mid.as_mut_ptr().cast(),
                src: src.as_ptr().cast(),
                len: 4000,
                to: CopyTo::Local,
            });
            side.enqueue(Task::Record(n.clone()));
        }
        main.kick();
        let ev = main.record();
        let start = std::time::Instant::now();
        while !ev.is_done() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "background thread made no progress"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        ev.wait().unwrap();
        assert_eq!(dst, src);
    }

    #[test]
    fn failure_is_sticky_and_reported_by_later_events() {
        let e = engine();
        let s = e.stream();
        let before = s.record();
        // SAFETY: no pointers.
        unsafe {
            s.enqueue(Task::Callback(Box::new(|| {
                Poll::Ready(Err(Error::InvalidUsage("boom".into())))
            })));
        }
        assert!(before.wait().is_ok());
        let err = s.synchronize().unwrap_err();
        assert_eq!(err, Error::InvalidUsage("boom".into()));
        // SAFETY: no pointers.
        unsafe { s.enqueue(Task::Callback(Box::new(|| Poll::Ready(Ok(()))))) };
        assert!(s.synchronize().is_err());
    }

    #[test]
    fn stuck_task_times_out_with_its_description() {
        let e = Engine::new(Doorbell::new(), Duration::from_millis(200));
        let s = e.stream();
        let n = e.notify();
        // SAFETY: no pointers.
        unsafe {
            s.enqueue(Task::Wait {
                notify: n.clone(),
                target: n.next_wait(),
            })
        };
        let start = std::time::Instant::now();
        let err = s.synchronize().unwrap_err();
        assert!(
            matches!(err, Error::Timeout(ref m) if m.contains("notify wait")),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn abort_fails_pending_work_promptly() {
        let e = engine();
        let s = e.stream();
        let n = e.notify();
        // SAFETY: no pointers.
        unsafe {
            s.enqueue(Task::Wait {
                notify: n.clone(),
                target: n.next_wait(),
            })
        };
        e.abort(Error::Aborted("by test".into()));
        assert_eq!(
            s.synchronize().unwrap_err(),
            Error::Aborted("by test".into())
        );
    }

    /// The abort hook runs once, with the first failure, before the engine's other work
    /// fails: a waiter on another stream sees the abort only after the hook has run.
    #[test]
    fn abort_hook_runs_once_before_the_other_work_fails() {
        use std::sync::atomic::AtomicBool;
        let e = engine();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let other_failed = Arc::new(AtomicBool::new(false));
        let (other, failing) = (e.stream(), e.stream());
        let n = e.notify();
        // SAFETY: no pointers.
        unsafe {
            other.enqueue(Task::Wait {
                notify: n.clone(),
                target: n.next_wait(),
            })
        };
        let seen = other.record();
        let (c, f, ev) = (calls.clone(), other_failed.clone(), seen.clone());
        e.set_abort_hook(Box::new(move |err| {
            f.store(ev.is_done(), Ordering::SeqCst);
            lock(&c).push(err.clone());
        }));
        // SAFETY: no pointers.
        unsafe {
            failing.enqueue(Task::Callback(Box::new(|| {
                Poll::Ready(Err(Error::InvalidUsage("boom".into())))
            })))
        };
        assert_eq!(
            failing.synchronize().unwrap_err(),
            Error::InvalidUsage("boom".into())
        );
        assert_eq!(seen.wait().unwrap_err(), Error::InvalidUsage("boom".into()));
        e.abort(Error::Aborted("later".into()));
        assert_eq!(*lock(&calls), [Error::InvalidUsage("boom".into())]);
        assert!(
            !other_failed.load(Ordering::SeqCst),
            "the hook ran after the abort"
        );
    }

    #[test]
    fn event_future_completes_under_a_foreign_executor() {
        let e = engine();
        let (a, b) = (e.stream(), e.stream());
        let n = e.notify();
        // SAFETY: no pointers.
        unsafe {
            a.enqueue(Task::Wait {
                notify: n.clone(),
                target: n.next_wait(),
            })
        };
        let ev = a.record();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: no pointers.
            unsafe { b.enqueue(Task::Record(n)) };
            b.kick();
        });
        let r = block_on(ev);
        assert!(r.is_ok());
        t.join().unwrap();
    }

    /// Minimal executor: parks the thread until woken.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        use std::task::{Context, Wake};
        struct Th(std::thread::Thread);
        impl Wake for Th {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::sync::Arc::new(Th(std::thread::current())).into();
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park_timeout(Duration::from_secs(1));
        }
    }
}
