//! Communicator entry points: init, split, destroy, abort and queries (bodies in `comm`).

use std::ffi::c_int;

use crate::comm::{self, comm_ref};
use crate::error::{guard, guard_keep, invalid};
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;

/// Joins the communicator of `nranks` ranks named by `commId` as `rank` (blocking; collective
/// over the ranks).
///
/// # Safety
/// `comm` is writable, `commId` readable (or NULL: an error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommInitRank(
    comm: *mut ampcclComm_t,
    nranks: c_int,
    commId: ampcclUniqueId,
    rank: c_int,
) -> ampcclResult_t {
    guard("ampcclCommInitRank", || {
        // SAFETY: forwarded from the caller; the id is a local copy.
        unsafe { comm::init_rank(comm, nranks, &commId, rank, std::ptr::null()) }
    })
}

/// As [`ampcclCommInitRank`] with options; with `config->blocking == 0` it returns
/// `ampcclInProgress` at once and initializes on a thread (poll `ampcclCommGetAsyncError`).
///
/// # Safety
/// `comm` is writable; `config` is NULL or made with `AMPCCL_CONFIG_INITIALIZER`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommInitRankConfig(
    comm: *mut ampcclComm_t,
    nranks: c_int,
    commId: ampcclUniqueId,
    rank: c_int,
    config: *mut ampcclConfig_t,
) -> ampcclResult_t {
    guard("ampcclCommInitRankConfig", || {
        // SAFETY: forwarded from the caller; the id is a local copy.
        unsafe { comm::init_rank(comm, nranks, &commId, rank, config) }
    })
}

/// Extension: joins the job the launcher started, as the Rust API's `Communicator::from_env`
/// (blocking; collective over the ranks): `ampccl-run`'s `AMPCCL_UNIQUE_ID` + `RANK` /
/// `WORLD_SIZE`, torchrun (through its TCPStore), `MASTER_ADDR`/`MASTER_PORT`, or an
/// MPICH-family `mpirun` / `srun --mpi=pmi2` (PMI-1 on `PMI_FD`). Without any it returns
/// `ampcclInvalidArgument`; `ampcclGetLastError(NULL)` says what to set.
///
/// # Safety
/// `comm` is writable (or NULL: an error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommInitFromEnv(comm: *mut ampcclComm_t) -> ampcclResult_t {
    guard("ampcclCommInitFromEnv", || {
        // SAFETY: forwarded from the caller.
        unsafe { comm::init_from_env(comm) }
    })
}

/// Creates `ndev` ranks of one new communicator in this process (`comm[i]` is rank `i`);
/// `devlist` is ignored (host memory) and may be NULL.
///
/// # Safety
/// `comm` is writable for `ndev` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommInitAll(
    comm: *mut ampcclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ampcclResult_t {
    let _ = devlist;
    guard("ampcclCommInitAll", || {
        // SAFETY: forwarded from the caller.
        unsafe { comm::init_all(comm, ndev) }
    })
}

/// Splits `comm` (collective over it): ranks with the same `color` form one communicator,
/// ordered by `key` then rank; `AMPCCL_SPLIT_NOCOLOR` joins none (`*newcomm = NULL`).
/// `config` may be NULL; its `blocking` applies, its `timeoutS` does not (the parent's holds).
///
/// # Safety
/// `comm` is a live handle; `newcomm` writable; `config` NULL or initialized.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommSplit(
    comm: ampcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ampcclComm_t,
    config: *mut ampcclConfig_t,
) -> ampcclResult_t {
    guard("ampcclCommSplit", || {
        // SAFETY: forwarded from the caller.
        unsafe { comm::split(comm, color, key, newcomm, config) }
    })
}

/// Waits for the communicator's operations, releases it and frees the handle. Returns
/// `ampcclSuccess`, or the error of its operations that failed (the asynchronous error,
/// e.g. `ampcclRemoteError` after a peer died, `ampcclTimeout`); the handle is freed in every
/// case, also when an error is returned. NULL is `ampcclInvalidArgument`; destroying a handle
/// twice is undefined (as with NCCL); destroying after `ampcclCommAbort` is fine and returns
/// `ampcclSuccess`.
///
/// # Safety
/// `comm` is NULL or a live handle, unused afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommDestroy(comm: ampcclComm_t) -> ampcclResult_t {
    guard("ampcclCommDestroy", || {
        // SAFETY: forwarded from the caller.
        unsafe { comm::destroy(comm) }
    })
}

/// Stops the communicator now: queued operations fail, peers are told. Unlike NCCL the handle
/// stays allocated until `ampcclCommDestroy` (which is then safe and returns at once).
///
/// # Safety
/// `comm` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommAbort(comm: ampcclComm_t) -> ampcclResult_t {
    guard("ampcclCommAbort", || {
        // SAFETY: forwarded from the caller.
        unsafe { comm::abort(comm) }
    })
}

/// `*asyncError` = `ampcclInProgress` while a non-blocking init runs, then `ampcclSuccess` or
/// the first error the communicator met (its text: `ampcclGetLastError`).
///
/// # Safety
/// `comm` is a live handle; `asyncError` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommGetAsyncError(
    comm: ampcclComm_t,
    asyncError: *mut ampcclResult_t,
) -> ampcclResult_t {
    guard("ampcclCommGetAsyncError", || {
        // SAFETY: forwarded from the caller.
        let h = unsafe { comm_ref(comm)? };
        // SAFETY: forwarded from the caller.
        let out = unsafe { asyncError.as_mut() }.ok_or_else(|| invalid("asyncError is NULL"))?;
        *out = comm::async_error(h);
        Ok(ampcclSuccess)
    })
}

/// `*count` = the number of ranks.
///
/// # Safety
/// `comm` is a live handle; `count` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommCount(comm: ampcclComm_t, count: *mut c_int) -> ampcclResult_t {
    guard("ampcclCommCount", || {
        // SAFETY: forwarded from the caller.
        let c = unsafe { comm_ref(comm)? }.shared.ready()?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { count.as_mut() }.ok_or_else(|| invalid("count is NULL"))?;
        *out = c.world() as c_int;
        Ok(ampcclSuccess)
    })
}

/// `*rank` = this rank.
///
/// # Safety
/// `comm` is a live handle; `rank` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommUserRank(
    comm: ampcclComm_t,
    rank: *mut c_int,
) -> ampcclResult_t {
    guard("ampcclCommUserRank", || {
        // SAFETY: forwarded from the caller.
        let c = unsafe { comm_ref(comm)? }.shared.ready()?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { rank.as_mut() }.ok_or_else(|| invalid("rank is NULL"))?;
        *out = c.rank() as c_int;
        Ok(ampcclSuccess)
    })
}

/// Extension: blocks until every operation issued on `comm` so far (on any stream, the NULL
/// stream included) has completed; returns its error, if any.
///
/// # Safety
/// `comm` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclCommSynchronize(comm: ampcclComm_t) -> ampcclResult_t {
    guard_keep("ampcclCommSynchronize", || {
        // SAFETY: forwarded from the caller.
        comm::synchronize(unsafe { comm_ref(comm)? })
    })
}
