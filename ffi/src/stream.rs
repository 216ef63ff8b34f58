//! Streams and events of the C ABI, and the submission of operations to them.
//!
//! Native streams belong to one communicator's engine; a C stream (`ampcclStream_t`) does not:
//! like a CUDA stream it is created on its own (`ampcclStreamCreate(&s)`) and may carry the
//! operations of several communicators. It binds lazily: the first operation of a
//! communicator on it creates a native stream of that communicator (kept while the
//! communicator lives), and the C stream keeps its *tail* — the completion events of the
//! latest submission. Each submission first waits for the tail, so the operations of a C
//! stream run in issue order whatever communicators they belong to; the batches of one group
//! (one per communicator) all wait for the same tail and run concurrently.
//!
//! An event (`ampcclEvent_t`) is a copy of a stream's tail taken by `ampcclEventRecord`;
//! `ampcclStreamWaitEvent` adds it to a stream's tail. Queries return `ampcclSuccess` once
//! complete, `ampcclInProgress` while pending (CUDA says `cudaErrorNotReady`), or the error.
//! The NULL stream of a collective call is the communicator's own default stream; it is not a
//! C stream (waiting for it: `ampcclCommSynchronize`).
//!
//! **Waiting callers run their work.** A C program enqueues and then synchronizes in two
//! calls. A single small operation (not a group, at most [`PARK_MAX_BYTES`] a rank) is
//! therefore submitted *for a waiter* ([`Communicator::enqueue_raw_for_waiter`]): on an idle
//! communicator its tasks are parked on the native stream instead of queued, nobody is woken,
//! and the thread that synchronizes runs them itself, as the Rust blocking call does (see
//! `ampccl_runtime::park`: one owner at a time, the engine thread only takes work nobody
//! claimed within 2 to 16 ms). This thread remembers what it parked ([`PARKED`]): a
//! synchronize runs what its events cover and first hands everything else it parked to the
//! engine (so work of other communicators it waits on indirectly progresses); any other call
//! (except recording an event and issuing more operations, whose ordering the native library
//! takes care of) hands all of it to the engine. Everything else (groups, large operations,
//! operations behind pending work) is queued and kicked as before.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ampccl_native::{Communicator, Event, RawOp, Stream};

use crate::comm::CommShared;
use crate::error::{FfiResult, invalid};
use crate::types::ampcclResult_t::{self, *};
use crate::types::{ampcclEvent, ampcclEvent_t, ampcclStream, ampcclStream_t};

/// The operations of one communicator submitted together.
pub(crate) struct Batch {
    pub shared: Arc<CommShared>,
    pub comm: Communicator,
    pub ops: Ops,
}

/// A batch's operations: one (a plain call, no allocation) or several (a group).
pub(crate) enum Ops {
    One(RawOp),
    Many(Vec<RawOp>),
}

impl Ops {
    pub(crate) fn as_slice(&self) -> &[RawOp] {
        match self {
            Ops::One(op) => std::slice::from_ref(op),
            Ops::Many(v) => v,
        }
    }

    pub(crate) fn push(&mut self, op: RawOp) {
        match self {
            Ops::One(first) => *self = Ops::Many(vec![*first, op]),
            Ops::Many(v) => v.push(op),
        }
    }
}

#[derive(Default)]
struct Tail {
    /// Events the next submission waits for (and synchronize/query look at).
    deps: Vec<Event>,
    /// Native stream per communicator that used this C stream.
    bound: Vec<(Weak<CommShared>, Stream)>,
}

impl AsRef<[Event]> for Tail {
    fn as_ref(&self) -> &[Event] {
        &self.deps
    }
}

/// State of a C stream.
#[derive(Default)]
pub(crate) struct StreamState(Mutex<Tail>);

/// State of a C event: the tail it recorded.
#[derive(Default)]
pub(crate) struct EventState(Mutex<Vec<Event>>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Largest operation (bytes a rank, `count` elements) submitted for a waiter: above it the
/// wake-up of the engine thread costs little next to the operation, and work enqueued to
/// overlap with computation starts at once.
pub(crate) const PARK_MAX_BYTES: usize = 256 << 10;

thread_local! {
    /// Native streams this thread parked work on (see the module documentation).
    static PARKED: RefCell<Vec<Stream>> = const { RefCell::new(Vec::new()) };
}

/// Hands everything this thread parked to the engines (every C ABI call but the synchronize
/// calls, event records and operations does this first).
pub(crate) fn flush_parked() {
    // In place, keeping the list's memory (`unpark` does not come back here).
    PARKED.with(|p| {
        p.borrow_mut().retain(|s| {
            s.unpark();
            false
        })
    });
}

/// How many native streams hold work this thread parked (tests).
#[cfg(test)]
pub(crate) fn parked_by_this_thread() -> usize {
    PARKED.with(|p| p.borrow().iter().filter(|s| s.has_parked()).count())
}

/// Enqueues `b` on native stream `s` and makes sure it progresses: parked for a waiter when
/// `for_waiter` (see the module documentation), else queued and kicked.
fn enqueue(s: &Stream, b: &Batch, for_waiter: bool) -> FfiResult<Event> {
    // SAFETY: the C caller guarantees the buffers stay valid until the operation completes
    // (NCCL's contract, documented on every collective in the header).
    let ev = unsafe {
        if for_waiter {
            b.comm.enqueue_raw_for_waiter(s, b.ops.as_slice())?
        } else {
            b.comm.enqueue_raw(s, b.ops.as_slice())?
        }
    };
    if for_waiter && s.has_parked() {
        PARKED.with(|p| {
            let mut p = p.borrow_mut();
            if !p.iter().any(|x| x.same_as(s)) {
                p.push(s.clone());
            }
        });
    } else if !(for_waiter && ev.is_done()) {
        s.kick();
    }
    b.shared.note(ev.clone());
    Ok(ev)
}

/// Whether `batches` (one submission) may be parked for a waiter: one small operation.
fn for_waiter(batches: &[Batch]) -> bool {
    match batches {
        [b] => match b.ops.as_slice() {
            [op] => op.spec.count.saturating_mul(op.spec.dtype.size()) <= PARK_MAX_BYTES,
            _ => false,
        },
        _ => false,
    }
}

/// Submits `batches` to `stream` (NULL: each communicator's default stream).
///
/// # Safety
/// `stream` is NULL or a live handle.
pub(crate) unsafe fn submit(stream: ampcclStream_t, batches: &[Batch]) -> FfiResult {
    let park = for_waiter(batches);
    // SAFETY: forwarded from the caller.
    let Some(st) = (unsafe { stream.as_ref() }) else {
        let mut first = None;
        for b in batches {
            if let Err(e) = enqueue(b.comm.default_stream(), b, park) {
                first.get_or_insert(e);
            }
        }
        return first.map_or(Ok(()), Err);
    };
    let mut guard = lock(&st.inner.0);
    let tail = &mut *guard;
    tail.bound.retain(|(w, _)| w.strong_count() > 0);
    let before: Vec<Event> = tail.deps.iter().filter(|e| !e.is_done()).cloned().collect();
    // The new events go after the old ones, which then make room (the list keeps its memory).
    let old = tail.deps.len();
    let mut first = None;
    for b in batches {
        let found = tail
            .bound
            .iter()
            .position(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&b.shared)));
        let i = found.unwrap_or_else(|| {
            tail.bound
                .push((Arc::downgrade(&b.shared), b.comm.stream()));
            tail.bound.len() - 1
        });
        let s = &tail.bound[i].1;
        for d in &before {
            // Work parked before it (by any thread) must run for this one to start.
            d.unpark();
            s.wait_event(d);
        }
        match enqueue(s, b, park) {
            Ok(ev) => tail.deps.push(ev),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    if tail.deps.len() > old {
        tail.deps.drain(..old);
        if first.is_some() {
            tail.deps.extend(before);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Overall status of `events`: `None` while one is pending, else the first error or success.
fn status(events: &[Event]) -> Option<FfiResult> {
    let mut r = Ok(());
    for e in events {
        match e.status()? {
            Err(x) if r.is_ok() => r = Err(x),
            _ => {}
        }
    }
    Some(r)
}

/// Blocks until all of `events` are complete, running the work this thread parked for them;
/// returns the first error. What this thread parked elsewhere goes to the engines first: the
/// waited work may depend on it (ranks of one process driven by one thread).
pub(crate) fn wait(events: &[Event]) -> FfiResult<ampcclResult_t> {
    // In place (`unpark` does not come back here): keep what the events cover.
    PARKED.with(|p| {
        p.borrow_mut().retain(|s| {
            events.iter().any(|e| e.is_on(s)) || {
                s.unpark();
                false
            }
        })
    });
    let r = wait_all(events);
    // Work parked after the waited events, if any: nothing waits for it now.
    flush_parked();
    r
}

fn wait_all(events: &[Event]) -> FfiResult<ampcclResult_t> {
    let mut r = Ok(ampcclSuccess);
    for e in events {
        if let Err(x) = e.wait()
            && r.is_ok()
        {
            r = Err(x);
        }
    }
    r
}

fn query(events: &[Event]) -> FfiResult<ampcclResult_t> {
    // A query does not drive: parked work (of any thread) goes to the engine.
    for e in events {
        e.unpark();
    }
    match status(events) {
        None => Ok(ampcclInProgress),
        Some(r) => r.map(|()| ampcclSuccess),
    }
}

const NULL_STREAM: &str = "stream is NULL (the NULL stream of a collective is each \
     communicator's own default stream: wait for it with ampcclCommSynchronize)";

/// The C stream behind `s`.
///
/// # Safety
/// `s` is NULL or a live stream handle.
pub(crate) unsafe fn stream_ref<'a>(s: ampcclStream_t) -> FfiResult<&'a ampcclStream> {
    // SAFETY: forwarded from the caller.
    unsafe { s.as_ref() }.ok_or_else(|| invalid(NULL_STREAM))
}

/// The C event behind `e`.
///
/// # Safety
/// `e` is NULL or a live event handle.
pub(crate) unsafe fn event_ref<'a>(e: ampcclEvent_t) -> FfiResult<&'a ampcclEvent> {
    // SAFETY: forwarded from the caller.
    unsafe { e.as_ref() }.ok_or_else(|| invalid("event is NULL"))
}

fn deps(s: &ampcclStream) -> Vec<Event> {
    lock(&s.inner.0).deps.clone()
}

/// `f(events)` on a copy of `events` taken under `m`'s lock (no allocation for one event).
fn with_copy<R>(m: &Mutex<impl AsRef<[Event]>>, f: impl FnOnce(&[Event]) -> R) -> R {
    let g = lock(m);
    match g.as_ref() {
        [one] => {
            let one = one.clone();
            drop(g);
            f(std::slice::from_ref(&one))
        }
        all => {
            let all = all.to_vec();
            drop(g);
            f(&all)
        }
    }
}

/// A new, unbound stream handle.
pub(crate) fn new_stream() -> ampcclStream_t {
    Box::into_raw(Box::new(ampcclStream {
        inner: StreamState::default(),
    }))
}

/// A new event handle (complete until recorded).
pub(crate) fn new_event() -> ampcclEvent_t {
    Box::into_raw(Box::new(ampcclEvent {
        inner: EventState::default(),
    }))
}

/// `ampcclStreamSynchronize`.
pub(crate) fn stream_synchronize(s: &ampcclStream) -> FfiResult<ampcclResult_t> {
    with_copy(&s.inner.0, wait)
}

/// `ampcclStreamQuery`.
pub(crate) fn stream_query(s: &ampcclStream) -> FfiResult<ampcclResult_t> {
    query(&deps(s))
}

/// `ampcclEventRecord`.
pub(crate) fn event_record(e: &ampcclEvent, s: &ampcclStream) -> ampcclResult_t {
    // Nested locks, stream then event (nothing takes them the other way round); the event's
    // list keeps its memory.
    let tail = lock(&s.inner.0);
    let mut ev = lock(&e.inner.0);
    ev.clear();
    ev.extend(tail.deps.iter().cloned());
    ampcclSuccess
}

/// `ampcclEventSynchronize`.
pub(crate) fn event_synchronize(e: &ampcclEvent) -> FfiResult<ampcclResult_t> {
    with_copy(&e.inner.0, wait)
}

/// `ampcclEventQuery`.
pub(crate) fn event_query(e: &ampcclEvent) -> FfiResult<ampcclResult_t> {
    let evs = lock(&e.inner.0).clone();
    query(&evs)
}

/// `ampcclStreamWaitEvent`: later submissions to `s` wait for `e` (as recorded now).
pub(crate) fn stream_wait_event(s: &ampcclStream, e: &ampcclEvent) -> ampcclResult_t {
    let evs = lock(&e.inner.0).clone();
    lock(&s.inner.0).deps.extend(evs);
    ampcclSuccess
}

/// Frees a stream or event handle made by this module.
///
/// # Safety
/// `p` is a live handle made by `Box::into_raw`, not used after this call.
pub(crate) unsafe fn free<T>(p: *mut T, what: &str) -> FfiResult<ampcclResult_t> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: forwarded from the caller.
    drop(unsafe { Box::from_raw(p) });
    Ok(ampcclSuccess)
}
