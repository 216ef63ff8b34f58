//! The one error type of ampccl (shared by every crate), with NCCL-like result classes.

use std::fmt;

/// Error of any ampccl operation. The variants mirror the classes of `ncclResult_t` so the C ABI
/// maps them one to one; each carries a message that says what went wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A call argument is wrong (null or short buffer, bad rank/root/dtype/op, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The calls are valid alone but wrong together (mismatched collectives across ranks, ...).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A peer failed, died or reported an error.
    #[error("remote error: {0}")]
    Remote(String),
    /// The operating system refused something (shared memory, sockets, ...).
    #[error("system error: {0}")]
    System(String),
    /// A wait exceeded `AMPCCL_TIMEOUT_S`.
    #[error("timeout: {0}")]
    Timeout(String),
    /// The communicator was aborted.
    #[error("aborted: {0}")]
    Aborted(String),
    /// A bug in ampccl.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result alias used throughout ampccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds an [`Error::System`] from an I/O error with context.
    pub fn system(context: impl fmt::Display, e: impl fmt::Display) -> Error {
        Error::System(format!("{context}: {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::System(e.to_string())
    }
}
