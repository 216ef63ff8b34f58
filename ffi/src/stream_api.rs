//! Stream and event entry points (CUDA-runtime-shaped; semantics in `stream`).

use crate::error::{guard, guard_keep, invalid};
use crate::stream::{self, event_ref, stream_ref};
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;

/// Creates a stream. Unlike a native ampccl stream it belongs to no communicator: it binds to
/// each communicator on that communicator's first operation on it, and runs everything
/// submitted to it in issue order.
///
/// # Safety
/// `stream` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclStreamCreate(stream: *mut ampcclStream_t) -> ampcclResult_t {
    guard("ampcclStreamCreate", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { stream.as_mut() }.ok_or_else(|| invalid("stream is NULL"))?;
        *out = stream::new_stream();
        Ok(ampcclSuccess)
    })
}

/// Frees a stream handle; work already submitted still runs (like `cudaStreamDestroy`).
///
/// # Safety
/// `stream` is a live handle, unused afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclStreamDestroy(stream: ampcclStream_t) -> ampcclResult_t {
    guard("ampcclStreamDestroy", || {
        // SAFETY: forwarded from the caller.
        unsafe { stream::free(stream, "stream") }
    })
}

/// Blocks until everything submitted to `stream` has completed; returns the first error.
///
/// # Safety
/// `stream` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclStreamSynchronize(stream: ampcclStream_t) -> ampcclResult_t {
    guard_keep("ampcclStreamSynchronize", || {
        // SAFETY: forwarded from the caller.
        stream::stream_synchronize(unsafe { stream_ref(stream)? })
    })
}

/// `ampcclSuccess` when everything submitted has completed, `ampcclInProgress` while work is
/// pending (CUDA: `cudaErrorNotReady`), or the first error.
///
/// # Safety
/// `stream` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclStreamQuery(stream: ampcclStream_t) -> ampcclResult_t {
    guard("ampcclStreamQuery", || {
        // SAFETY: forwarded from the caller.
        stream::stream_query(unsafe { stream_ref(stream)? })
    })
}

/// Later submissions to `stream` start after `event` (as recorded at this call) completes.
///
/// # Safety
/// Both are live handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclStreamWaitEvent(
    stream: ampcclStream_t,
    event: ampcclEvent_t,
) -> ampcclResult_t {
    guard("ampcclStreamWaitEvent", || {
        // SAFETY: forwarded from the caller.
        let (s, e) = unsafe { (stream_ref(stream)?, event_ref(event)?) };
        Ok(stream::stream_wait_event(s, e))
    })
}

/// Creates an event (complete until recorded).
///
/// # Safety
/// `event` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclEventCreate(event: *mut ampcclEvent_t) -> ampcclResult_t {
    guard("ampcclEventCreate", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { event.as_mut() }.ok_or_else(|| invalid("event is NULL"))?;
        *out = stream::new_event();
        Ok(ampcclSuccess)
    })
}

/// Frees an event handle.
///
/// # Safety
/// `event` is a live handle, unused afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclEventDestroy(event: ampcclEvent_t) -> ampcclResult_t {
    guard("ampcclEventDestroy", || {
        // SAFETY: forwarded from the caller.
        unsafe { stream::free(event, "event") }
    })
}

/// Marks the current end of `stream` in `event` (the NULL stream is refused: it is per
/// communicator).
///
/// # Safety
/// Both are live handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclEventRecord(
    event: ampcclEvent_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclEventRecord", || {
        // SAFETY: forwarded from the caller.
        let (e, s) = unsafe { (event_ref(event)?, stream_ref(stream)?) };
        Ok(stream::event_record(e, s))
    })
}

/// Blocks until the work `event` marks has completed; returns its first error.
///
/// # Safety
/// `event` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclEventSynchronize(event: ampcclEvent_t) -> ampcclResult_t {
    guard_keep("ampcclEventSynchronize", || {
        // SAFETY: forwarded from the caller.
        stream::event_synchronize(unsafe { event_ref(event)? })
    })
}

/// `ampcclSuccess` when complete, `ampcclInProgress` while pending, or the first error.
///
/// # Safety
/// `event` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclEventQuery(event: ampcclEvent_t) -> ampcclResult_t {
    guard("ampcclEventQuery", || {
        // SAFETY: forwarded from the caller.
        stream::event_query(unsafe { event_ref(event)? })
    })
}
