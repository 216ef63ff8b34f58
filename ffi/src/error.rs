//! Errors across the boundary: the mapping of [`ampccl_native::Error`] to result codes, the
//! thread-local last-error text (`ampcclGetLastError`), static code descriptions
//! (`ampcclGetErrorString`) and [`guard`], which wraps every entry point so that no panic
//! crosses into C.
//!
//! | native error | result code | why |
//! |---|---|---|
//! | `InvalidArgument` | `ampcclInvalidArgument` | |
//! | `InvalidUsage` | `ampcclInvalidUsage` | |
//! | `Remote` | `ampcclRemoteError` | a peer failed or reported an error |
//! | `System` | `ampcclSystemError` | |
//! | `Timeout` | `ampcclTimeout` | NCCL 2.28's own code for it (`ncclTimeout = 8`) |
//! | `Aborted` | `ampcclRemoteError` | what NCCL reports on ranks whose work ends because a communicator was aborted |
//! | `Internal`, a panic | `ampcclInternalError` | |

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ampccl_native::Error;

use crate::types::ampcclResult_t::{self, *};

/// Result of the internal functions behind the entry points.
pub(crate) type FfiResult<T = ()> = Result<T, Error>;

/// The result code of a native error.
pub(crate) fn code_of(e: &Error) -> ampcclResult_t {
    match e {
        Error::InvalidArgument(_) => ampcclInvalidArgument,
        Error::InvalidUsage(_) => ampcclInvalidUsage,
        Error::Remote(_) | Error::Aborted(_) => ampcclRemoteError,
        Error::System(_) => ampcclSystemError,
        Error::Timeout(_) => ampcclTimeout,
        Error::Internal(_) => ampcclInternalError,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Records `e` raised by `func` as the thread's last error and returns its code. A refused
/// call (a bad argument or usage) is the caller's to handle, as with NCCL, which stays silent
/// unless asked: it is logged at `info` only; a failure of the library or of a peer at `warn`.
pub(crate) fn report(func: &str, e: &Error) -> ampcclResult_t {
    let msg = format!("{func}: {e}");
    if refusal(e) {
        tracing::info!("{msg}");
    } else {
        tracing::warn!("{msg}");
    }
    set_last_error(&msg);
    code_of(e)
}

/// Whether `e` refuses a call (the caller's mistake) rather than reporting a failure.
fn refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_) | Error::InvalidUsage(_))
}

/// Runs the body of entry point `func`: maps its error to a code (recording the message), and a
/// panic to `ampcclInternalError`. First hands the work this thread parked for a waiter to the
/// engines (see `stream`): the caller does something else than wait for it.
pub(crate) fn guard(func: &str, f: impl FnOnce() -> FfiResult<ampcclResult_t>) -> ampcclResult_t {
    guard_keep(func, || {
        crate::stream::flush_parked();
        f()
    })
}

/// As [`guard`], leaving parked work in place: for the calls that wait for it, record an event
/// of it, or issue more operations (ordered after it by the native library).
pub(crate) fn guard_keep(
    func: &str,
    f: impl FnOnce() -> FfiResult<ampcclResult_t>,
) -> ampcclResult_t {
    ampccl_native::config::init_logging();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => report(func, &e),
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            report(func, &Error::Internal(format!("panic: {what}")))
        }
    }
}

/// `InvalidArgument` with `msg`.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// Static description of a result code (like `ncclGetErrorString`).
pub(crate) fn describe(code: i32) -> &'static CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled cuda error (not used by ampccl)",
        2 => c"unhandled system error (ampcclGetLastError has the details)",
        3 => c"internal error - please report this issue to the ampccl developers",
        4 => c"invalid argument (ampcclGetLastError has the reason)",
        5 => c"invalid usage (ampcclGetLastError has the reason)",
        6 => c"remote process exited or there was a network error",
        7 => c"operation in progress",
        8 => c"operation timed out (AMPCCL_TIMEOUT_S)",
        _ => c"unknown result code",
    }
}

/// Pointer to this thread's last error text, valid until this thread's next ampccl call.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_an_nccl_like_code() {
        let cases = [
            (Error::InvalidArgument("a".into()), ampcclInvalidArgument),
            (Error::InvalidUsage("a".into()), ampcclInvalidUsage),
            (Error::Remote("a".into()), ampcclRemoteError),
            (Error::System("a".into()), ampcclSystemError),
            (Error::Timeout("a".into()), ampcclTimeout),
            (Error::Aborted("a".into()), ampcclRemoteError),
            (Error::Internal("a".into()), ampcclInternalError),
        ];
        for (e, c) in cases {
            assert_eq!(code_of(&e), c, "{e}");
        }
    }

    #[test]
    fn guard_catches_panics_and_records_messages() {
        let r = guard("ampcclTest", || panic!("boom"));
        assert_eq!(r, ampcclInternalError);
        // SAFETY: the pointer is this thread's last-error string, alive until the next call.
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_str()
            .unwrap();
        assert!(msg.contains("ampcclTest") && msg.contains("boom"), "{msg}");
        assert_eq!(
            guard("ampcclTest", || Err(invalid("count too big"))),
            ampcclInvalidArgument
        );
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_str()
            .unwrap();
        assert_eq!(msg, "ampcclTest: invalid argument: count too big");
        assert_eq!(guard("ampcclTest", || Ok(ampcclSuccess)), ampcclSuccess);
        for c in 0..=9 {
            assert!(!describe(c).is_empty());
        }
    }
}
