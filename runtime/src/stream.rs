//! Streams (ordered asynchronous task queues) and events (points in a stream).
//!
//! A [`Stream`] belongs to an [`Engine`](crate::engine::Engine); tasks on one stream run in
//! order, tasks on different streams run concurrently (interleaved by the engine's driver).
//! An [`Event`] completes when every task enqueued before it has completed; it can be queried,
//! waited on (the waiting thread drives the engine) or awaited as a `Future` (under any
//! executor). A failed task fails its stream: the failure is sticky, every later event of the
//! stream reports it.
//!
//! A stream that is idle can be made *inline* for a while ([`Stream::inline_while_idle`]): its
//! tasks then run to completion on the enqueuing thread, inside `enqueue`, with the same
//! polling, back-off, timeout and health checks as the engine's. A blocking call of a
//! single-stream algorithm saves the queue and the driver that way (see the communicator's
//! small-message path); nothing else about the tasks changes.
//!
//! An idle stream can also be made *parking* ([`Stream::park_while_idle`]): its tasks are then
//! held aside for a thread about to wait for them, which runs them as an inline stream would
//! (see [`crate::park`]: the C ABI's enqueue-then-synchronize path).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::engine::EngineInner;
use crate::error::{Error, Result};
use std::sync::Arc;

use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// Engines and streams are shared with `std`'s Arc (method receivers need it; it guards no state).
type EngineArc = Arc<EngineInner>;
use crate::park::Parked;
use crate::task::{Completion, Task};

/// How often a stuck task is asked about its peers' health.
const HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// A task in a queue, with the bookkeeping for timeouts.
pub(crate) struct Queued {
    task: Task,
    polls: u32,
    first_pending: Option<Instant>,
    last_health: Option<Instant>,
}

impl Queued {
    pub(crate) fn new(task: Task) -> Queued {
        Queued {
            task,
            polls: 0,
            first_pending: None,
            last_health: None,
        }
    }

    /// Called after a `Pending` poll: fails the task when it has waited longer than `timeout`
    /// or when its peer is known dead.
    fn check_stuck(&mut self, timeout: Duration) -> Result<()> {
        // The first polls of a wait are hot (spinning): look at the clock only every 16th.
        // Later ones come after yields or sleeps, and the clock is cheap next to those.
        self.polls = self.polls.saturating_add(1);
        if self.polls < 256 && self.polls & 15 != 1 {
            return Ok(());
        }
        let now = Instant::now();
        let t0 = *self.first_pending.get_or_insert(now);
        if now.duration_since(t0) > timeout {
            return Err(Error::Timeout(format!(
                "{:?} still pending after {:.1} s (AMPCCL_TIMEOUT_S)",
                self.task,
                timeout.as_secs_f64()
            )));
        }
        let last = *self.last_health.get_or_insert(now);
        if now.duration_since(last) > HEALTH_INTERVAL {
            self.last_health = Some(now);
            self.task.check_health()?;
        }
        Ok(())
    }
}

pub(crate) struct StreamInner {
    pub(crate) queue: Mutex<VecDeque<Queued>>,
    /// Tasks ever enqueued (incremented under the queue lock).
    pub(crate) enqueued: AtomicU64,
    /// Tasks completed or failed.
    pub(crate) completed: AtomicU64,
    /// Sticky failure: position (1-based) of the first failed task and its error.
    failure: Mutex<Option<(u64, Error)>>,
    /// `failure.is_some()`, readable without the lock (enqueue checks it on every task).
    pub(crate) failed: AtomicBool,
    /// Tasks run inside `enqueue` (see [`Stream::inline_while_idle`]).
    inline: AtomicBool,
    /// Tasks held for a waiter (see [`crate::park`]).
    pub(crate) parked: Mutex<Parked>,
    /// `parked` holds tasks (readable without the lock).
    pub(crate) has_parked: AtomicBool,
    /// Tasks go to `parked` (see [`Stream::park_while_idle`]).
    pub(crate) parking: AtomicBool,
}

impl StreamInner {
    pub(crate) fn new() -> StreamInner {
        StreamInner {
            queue: Mutex::new(VecDeque::new()),
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            inline: AtomicBool::new(false),
            parked: Mutex::new(Parked::default()),
            has_parked: AtomicBool::new(false),
            parking: AtomicBool::new(false),
        }
    }

    /// Runs tasks from the head until one is pending. Returns the tasks finished and the
    /// error that failed the stream in this pass, if one did.
    pub(crate) fn advance(&self, timeout: Duration) -> (u64, Option<Error>) {
        let mut done = 0;
        loop {
            let Some(mut item) = lock(&self.queue).pop_front() else {
                return (done, None);
            };
            let failed = match item.task.poll() {
                Poll::Ready(Ok(())) => {
                    self.completed.fetch_add(1, Ordering::Release);
                    done += 1;
                    continue;
                }
                Poll::Ready(Err(e)) => e,
                Poll::Pending => match item.check_stuck(timeout) {
                    Ok(()) => {
                        lock(&self.queue).push_front(item);
                        return (done, None);
                    }
                    // What the check saw (a dead or failed peer, a peer waiting for something
                    // else) happened after everything that peer wrote before it: one more poll
                    // completes a task whose data did arrive in the meantime, so a peer that
                    // fails right after finishing its part fails no one else's operation.
                    Err(e) => match item.task.poll() {
                        Poll::Ready(Ok(())) => {
                            self.completed.fetch_add(1, Ordering::Release);
                            done += 1;
                            continue;
                        }
                        Poll::Ready(Err(again)) => again,
                        Poll::Pending => e,
                    },
                },
            };
            return (done + self.fail(failed.clone()), Some(failed));
        }
    }

    /// Fails the task just popped and every queued one; returns how many were dropped.
    fn fail(&self, e: Error) -> u64 {
        self.fail_queued(e, 1)
    }

    /// Records `e` as the stream's failure, at the next task to complete, unless it already
    /// failed (the first failure is the one it reports).
    pub(crate) fn record_failure(&self, e: Error) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some((self.completed.load(Ordering::Acquire) + 1, e));
            self.failed.store(true, Ordering::Release);
        }
    }

    /// Fails everything queued or parked (abort); returns how many queued tasks were dropped
    /// (parked ones are not in the engine's `pending` count).
    pub(crate) fn fail_all(&self, e: Error) -> u64 {
        self.fail_parked(&e);
        self.fail_queued(e, 0)
    }

    /// Drops the queue, counting `extra` already-popped tasks as failed too; the first failure
    /// of a stream is the one it reports.
    fn fail_queued(&self, e: Error, extra: u64) -> u64 {
        let mut q = lock(&self.queue);
        let dropped = q.len() as u64 + extra;
        if dropped == 0 {
            return 0;
        }
        q.clear();
        self.record_failure(e);
        self.completed.fetch_add(dropped, Ordering::Release);
        dropped
    }

    /// Description of the task at the head of the queue, if any.
    pub(crate) fn head(&self) -> Option<String> {
        lock(&self.queue).front().map(|q| format!("{:?}", q.task))
    }

    /// `Some(result)` once every task up to position `seq` has finished.
    fn status(&self, seq: u64) -> Option<Result<()>> {
        if self.completed.load(Ordering::Acquire) < seq {
            return None;
        }
        // `failed` is set before the failed tasks are counted as completed, so a completed
        // count that covers them also shows the flag.
        if !self.failed.load(Ordering::Acquire) {
            return Some(Ok(()));
        }
        match &*lock(&self.failure) {
            Some((pos, e)) if *pos <= seq => Some(Err(e.clone())),
            _ => Some(Ok(())),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data inconsistent (plain queue
    // pushes/pops), so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An ordered asynchronous task queue.
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
    pub(crate) engine: EngineArc,
}

impl Stream {
    /// Appends a task. It runs after every task enqueued before it on this stream.
    ///
    /// The task does not start until some thread drives the engine: a waiter on an event of
    /// this engine, or the background thread after [`Stream::kick`].
    ///
    /// # Safety
    /// Every pointer in `task` must stay valid (and, for destinations, not be accessed by
    /// anyone else) until the task has completed, i.e. until an event recorded after it
    /// completes.
    pub unsafe fn enqueue(&self, task: Task) {
        if self.inner.inline.load(Ordering::Relaxed) {
            return self.run_inline(task);
        }
        if self.inner.parking.load(Ordering::Relaxed) {
            return self.park(task);
        }
        if self.inner.has_parked.load(Ordering::Acquire) {
            // Parked tasks come first: into the queue with them (after a waiter running them
            // finished), the engine runs them next.
            crate::park::unpark(&self.inner, &self.engine, true);
        }
        let mut q = lock(&self.inner.queue);
        if self.inner.failed.load(Ordering::Acquire) {
            // A failed stream runs nothing more; the task counts as failed at once.
            self.inner.enqueued.fetch_add(1, Ordering::AcqRel);
            self.inner.completed.fetch_add(1, Ordering::Release);
            return;
        }
        q.push_back(Queued::new(task));
        self.inner.enqueued.fetch_add(1, Ordering::AcqRel);
        self.engine.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs `task` to completion on this thread, as the engine would at the head of this
    /// stream: polled, backing off while pending, failed after the timeout or on a dead peer.
    /// A failure is the stream's sticky failure, as for a queued task.
    fn run_inline(&self, task: Task) {
        let inner = &*self.inner;
        // Only this thread changes the counters while the stream is inline (its queue is
        // empty, so no driver pops or fails anything): plain stores, no locked instructions.
        let bump = |c: &AtomicU64| c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
        bump(&inner.enqueued);
        if !inner.failed.load(Ordering::Acquire)
            && let Err(e) = run_to_end(&self.engine, task)
        {
            inner.record_failure(e);
        }
        bump(&inner.completed);
    }

    /// Makes the stream inline until the guard drops, if it is idle (everything enqueued has
    /// completed, nothing failed); `None` otherwise. While inline, [`Stream::enqueue`] returns
    /// only once the task completed.
    ///
    /// Only for a thread that is the stream's sole user meanwhile (the communicator holds its
    /// submission lock): a task another thread enqueued concurrently would run inline on that
    /// thread too, and tasks waiting for each other across streams would wait forever, so
    /// callers make it inline only for operations that run on this one stream.
    pub fn inline_while_idle(&self) -> Option<InlineGuard<'_>> {
        let inner = &*self.inner;
        let idle = !inner.failed.load(Ordering::Acquire)
            && inner.completed.load(Ordering::Acquire) == inner.enqueued.load(Ordering::Acquire);
        idle.then(|| {
            inner.inline.store(true, Ordering::Relaxed);
            InlineGuard { stream: self }
        })
    }

    /// Makes sure queued work progresses even if nobody waits for it (starts the engine's
    /// background thread on first use and rings it).
    pub fn kick(&self) {
        self.engine.kick();
    }

    /// An event that completes when every task enqueued so far has completed.
    pub fn record(&self) -> Event {
        Event {
            stream: self.inner.clone(),
            engine: self.engine.clone(),
            seq: self.inner.enqueued.load(Ordering::Acquire),
        }
    }

    /// Makes later tasks of this stream wait for `event` (which may belong to another stream
    /// of the same engine).
    pub fn wait_event(&self, event: &Event) {
        // SAFETY: the task holds no pointers.
        unsafe { self.enqueue(Task::WaitEvent(Box::new(event.clone()))) }
    }

    /// `None` while work is queued; otherwise the stream's status.
    pub fn query(&self) -> Option<Result<()>> {
        self.record().status()
    }

    /// Blocks until everything enqueued so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.record().wait()
    }

    /// True when both handles name the same stream.
    pub fn same_as(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Runs `task` to completion on this thread, as the engine would at the head of its stream:
/// polled, driving the engine while pending (other streams progress meanwhile), failed after
/// the timeout, on a dead peer or when the engine aborts.
pub(crate) fn run_to_end(engine: &EngineArc, task: Task) -> Result<()> {
    let mut q = Queued::new(task);
    match q.task.poll() {
        Poll::Ready(r) => r,
        Poll::Pending => {
            let timeout = engine.timeout();
            engine.wait_until(|| {
                if let Some(e) = engine.aborted() {
                    return Some(Err(e));
                }
                match q.task.poll() {
                    Poll::Ready(r) => Some(r),
                    Poll::Pending => q.check_stuck(timeout).err().map(Err),
                }
            })
        }
    }
}

/// A stream inline until dropped (see [`Stream::inline_while_idle`]).
pub struct InlineGuard<'a> {
    stream: &'a Stream,
}

impl Drop for InlineGuard<'_> {
    fn drop(&mut self) {
        self.stream.inner.inline.store(false, Ordering::Relaxed);
    }
}

/// A point in a stream. Complete once every task enqueued on the stream before it has.
#[derive(Clone)]
pub struct Event {
    stream: Arc<StreamInner>,
    engine: EngineArc,
    seq: u64,
}

impl Event {
    /// `None` while pending, else the result of the tasks it covers.
    pub fn status(&self) -> Option<Result<()>> {
        self.stream.status(self.seq)
    }

    /// True once complete (successfully or not).
    pub fn is_done(&self) -> bool {
        self.status().is_some()
    }

    /// Blocks until complete, driving the engine on this thread while nobody else does; tasks
    /// parked before the event run on this thread (see [`crate::park`]).
    pub fn wait(&self) -> Result<()> {
        if let Some(r) = self.status() {
            return r;
        }
        if self.stream.has_parked.load(Ordering::Acquire) {
            crate::park::run_parked(&self.stream, &self.engine, self.seq);
            if let Some(r) = self.status() {
                return r;
            }
        }
        self.engine.wait_until(|| self.status())
    }

    /// The stream position the event marks.
    #[cfg(all(test, ampccl_loom))]
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Hands work parked on this event's stream to the engine (see [`Stream::unpark`]), for a
    /// caller that will not wait for it itself.
    pub fn unpark(&self) {
        crate::park::unpark(&self.stream, &self.engine, false);
    }

    /// True when the event is a point of stream `s`.
    pub fn is_on(&self, s: &Stream) -> bool {
        Arc::ptr_eq(&self.stream, &s.inner)
    }
}

impl Completion for Event {
    fn status(&self) -> Option<Result<()>> {
        Event::status(self)
    }
}

impl Future for Event {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(r) = self.status() {
            return Poll::Ready(r);
        }
        // A future does not block: parked work goes to the engine.
        crate::park::unpark(&self.stream, &self.engine, false);
        self.engine.try_progress();
        if let Some(r) = self.status() {
            return Poll::Ready(r);
        }
        self.engine.register_waker(cx.waker());
        // Re-check after registering: a completion in between would otherwise be missed.
        match self.status() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

#[cfg(all(test, ampccl_loom))]
mod loom_tests {
    use super::*;
    use crate::doorbell::Doorbell;
    use crate::engine::Engine;
    use crate::sync::AtomicUsize;

    /// A producer enqueues while the driver advances: tasks run exactly once, in order, and the
    /// event status agrees with the counters.
    #[test]
    fn enqueue_races_with_driver() {
        loom::model(|| {
            let e = Engine::new(Doorbell::new(), Duration::from_secs(3600));
            let s = e.stream();
            let step = Arc::new(crate::sync::Arc::new(AtomicUsize::new(0)));
            let s2 = s.clone();
            let st = step.clone();
            let producer = loom::thread::spawn(move || {
                for want in 0..2usize {
                    let st = st.clone();
                    // SAFETY: no pointers.
                    unsafe {
                        s2.enqueue(Task::Callback(Box::new(move || {
                            assert_eq!(st.fetch_add(1, Ordering::SeqCst), want, "out of order");
                            Poll::Ready(Ok(()))
                        })))
                    };
                }
            });
            while s.inner.completed.load(Ordering::Acquire) < 2 {
                s.inner.advance(Duration::from_secs(3600));
                loom::thread::yield_now();
            }
            producer.join().unwrap();
            assert_eq!(step.load(Ordering::SeqCst), 2);
            assert!(matches!(s.record().status(), Some(Ok(()))));
        });
    }
}
