//! `libampccl`: the NCCL-shaped C ABI of ampccl, for host memory.
//!
//! Every NCCL call has an `ampccl` twin with the same shape (`ncclAllReduce` →
//! `ampcclAllReduce`, `ncclResult_t` → `ampcclResult_t` with the same values, ...); the CUDA
//! stream and event calls the programs need have `ampcclStream*`/`ampcclEvent*` twins. The
//! header `include/ampccl.h` is generated from this crate by cbindgen (`cbindgen.toml`) and
//! checked in; `tests/header.rs` fails when it is stale (`AMPCCL_BLESS=1` rewrites it).
//!
//! - [`types`]: result codes, enums, unique id, config, handles.
//! - [`error`]: error mapping, last error, the panic guard around every entry point.
//! - `comm`/`comm_api`: communicators; `coll`: collectives; `group`: groups;
//!   `stream`/`stream_api`: streams and events; [`mem`]: `ampcclMemAlloc`/`ampcclMemFree`.
//!
//! Extensions beyond NCCL's API: `ampcclUniqueIdToString`/`ampcclUniqueIdFromString` (the hex
//! form of `AMPCCL_UNIQUE_ID`), `ampcclCommSynchronize`, and `timeoutS` in the config.

#![allow(non_snake_case)]

pub mod coll;
mod comm;
pub mod comm_api;
pub mod error;
mod group;
pub mod mem;
mod stream;
pub mod stream_api;
pub mod types;

#[cfg(test)]
mod park_tests;
#[cfg(test)]
mod tests;

use std::ffi::{CStr, c_char, c_int};

use ampccl_native::UniqueId;

use crate::error::{guard, invalid};
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;

/// `*version` = `AMPCCL_VERSION_CODE` of the library (`major * 10000 + minor * 100 + patch`).
///
/// # Safety
/// `version` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclGetVersion(version: *mut c_int) -> ampcclResult_t {
    guard("ampcclGetVersion", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { version.as_mut() }.ok_or_else(|| invalid("version is NULL"))?;
        *out = AMPCCL_VERSION_CODE;
        Ok(ampcclSuccess)
    })
}

/// Makes a new unique id and starts its rendezvous root in this process (call on one rank,
/// ship the bytes to the others). The root binds `AMPCCL_BOOTSTRAP_ADDR` (default 127.0.0.1).
///
/// # Safety
/// `uniqueId` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclGetUniqueId(uniqueId: *mut ampcclUniqueId) -> ampcclResult_t {
    guard("ampcclGetUniqueId", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { uniqueId.as_mut() }.ok_or_else(|| invalid("uniqueId is NULL"))?;
        let id = UniqueId::generate()?;
        for (o, b) in out.internal.iter_mut().zip(id.as_bytes()) {
            *o = *b as c_char;
        }
        Ok(ampcclSuccess)
    })
}

/// Extension: writes the id as 256 hex characters and a NUL (the form `AMPCCL_UNIQUE_ID`
/// takes) into `buf`, which must hold at least 257 bytes (`len`).
///
/// # Safety
/// `uniqueId` readable; `buf` writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclUniqueIdToString(
    uniqueId: *const ampcclUniqueId,
    buf: *mut c_char,
    len: usize,
) -> ampcclResult_t {
    guard("ampcclUniqueIdToString", || {
        // SAFETY: forwarded from the caller.
        let id = unsafe { uniqueId.as_ref() }.ok_or_else(|| invalid("uniqueId is NULL"))?;
        let need = 2 * AMPCCL_UNIQUE_ID_BYTES + 1;
        if buf.is_null() || len < need {
            return Err(invalid(format!(
                "buf is NULL or holds {len} bytes: {need} needed"
            )));
        }
        let mut hex = String::with_capacity(need);
        for b in id.internal {
            hex += &format!("{:02x}", b as u8);
        }
        // SAFETY: `buf` holds at least `need` bytes (checked above); the regions are distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(hex.as_ptr().cast(), buf, hex.len());
            *buf.add(hex.len()) = 0;
        }
        Ok(ampcclSuccess)
    })
}

/// Extension: parses the hex form (see [`ampcclUniqueIdToString`]); invalid text is
/// `ampcclInvalidArgument`.
///
/// # Safety
/// `str` is a NUL-terminated string; `uniqueId` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclUniqueIdFromString(
    str: *const c_char,
    uniqueId: *mut ampcclUniqueId,
) -> ampcclResult_t {
    guard("ampcclUniqueIdFromString", || {
        if str.is_null() {
            return Err(invalid("str is NULL"));
        }
        // SAFETY: forwarded from the caller.
        let out = unsafe { uniqueId.as_mut() }.ok_or_else(|| invalid("uniqueId is NULL"))?;
        // SAFETY: a NUL-terminated string (the caller's contract).
        let s = unsafe { CStr::from_ptr(str) };
        let id = UniqueId::from_hex(&s.to_string_lossy())?;
        for (o, b) in out.internal.iter_mut().zip(id.as_bytes()) {
            *o = *b as c_char;
        }
        Ok(ampcclSuccess)
    })
}

/// A static description of `result` (any value; unknown ones get "unknown result code").
#[unsafe(no_mangle)]
pub extern "C" fn ampcclGetErrorString(result: ampcclResult_raw) -> *const c_char {
    error::describe(result).as_ptr()
}

/// The text of the last error on this thread (`comm` is ignored and may be NULL, as with
/// NCCL); valid until this thread's next ampccl call.
#[unsafe(no_mangle)]
pub extern "C" fn ampcclGetLastError(comm: ampcclComm_t) -> *const c_char {
    let _ = comm;
    error::last_error_ptr()
}

/// Starts (or nests) a group on this thread: operations are collected until the outermost
/// `ampcclGroupEnd`.
#[unsafe(no_mangle)]
pub extern "C" fn ampcclGroupStart() -> ampcclResult_t {
    guard("ampcclGroupStart", || Ok(group::start()))
}

/// Ends a group; the outermost one submits the collected operations (one batch per
/// communicator; one stream per communicator within a group) and joins inits started inside.
#[unsafe(no_mangle)]
pub extern "C" fn ampcclGroupEnd() -> ampcclResult_t {
    guard("ampcclGroupEnd", group::end)
}
