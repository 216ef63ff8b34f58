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
    pub ops: Vec<RawOp>,
}

#[derive(Default)]
struct Tail {
    /// Events the next submission waits for (and synchronize/query look at).
    deps: Vec<Event>,
    /// Native stream per communicator that used this C stream.
    bound: Vec<(Weak<CommShared>, Stream)>,
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

/// Enqueues `b` on native stream `s` and makes sure it progresses.
fn enqueue(s: &Stream, b: &Batch) -> FfiResult<Event> {
    // SAFETY: the C caller guarantees the buffers stay valid until the operation completes
    // (NCCL's contract, documented on every collective in the header).
    let ev = unsafe { b.comm.enqueue_raw(s, &b.ops)? };
    s.kick();
    b.shared.note(ev.clone());
    Ok(ev)
}

/// Submits `batches` to `stream` (NULL: each communicator's default stream).
///
/// # Safety
/// `stream` is NULL or a live handle.
pub(crate) unsafe fn submit(stream: ampcclStream_t, batches: &[Batch]) -> FfiResult {
    // SAFETY: forwarded from the caller.
    let Some(st) = (unsafe { stream.as_ref() }) else {
        let mut first = None;
        for b in batches {
            if let Err(e) = enqueue(b.comm.default_stream(), b) {
                first.get_or_insert(e);
            }
        }
        return first.map_or(Ok(()), Err);
    };
    let mut tail = lock(&st.inner.0);
    tail.bound.retain(|(w, _)| w.strong_count() > 0);
    let before: Vec<Event> = tail.deps.iter().filter(|e| !e.is_done()).cloned().collect();
    let mut after = Vec::with_capacity(batches.len());
    let mut first = None;
    for b in batches {
        let found = tail
            .bound
            .iter()
            .find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&b.shared)))
            .map(|(_, s)| s.clone());
        let s = found.unwrap_or_else(|| {
            let s = b.comm.stream();
            tail.bound.push((Arc::downgrade(&b.shared), s.clone()));
            s
        });
        for d in &before {
            s.wait_event(d);
        }
        match enqueue(&s, b) {
            Ok(ev) => after.push(ev),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    if first.is_some() {
        after.extend(before);
    }
    if !after.is_empty() {
        tail.deps = after;
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

/// Blocks until all of `events` are complete; returns the first error.
fn wait(events: &[Event]) -> FfiResult<ampcclResult_t> {
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
    wait(&deps(s))
}

/// `ampcclStreamQuery`.
pub(crate) fn stream_query(s: &ampcclStream) -> FfiResult<ampcclResult_t> {
    query(&deps(s))
}

/// `ampcclEventRecord`.
pub(crate) fn event_record(e: &ampcclEvent, s: &ampcclStream) -> ampcclResult_t {
    *lock(&e.inner.0) = deps(s);
    ampcclSuccess
}

/// `ampcclEventSynchronize`.
pub(crate) fn event_synchronize(e: &ampcclEvent) -> FfiResult<ampcclResult_t> {
    let evs = lock(&e.inner.0).clone();
    wait(&evs)
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
