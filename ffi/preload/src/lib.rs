//! `libampccl_preload.so`: put it in `LD_PRELOAD` in front of an unchanged NCCL program and
//! each large collective is split between the real NCCL (NVLink, IB) and ampccl's PCIe path
//! through pinned host memory. Results are the same; calls stay asynchronous.
//!
//! The library exports only the NCCL functions it must see — communicator creation and
//! destruction (to know domains, ranks and devices), groups (to defer joins), the five
//! collectives, and `ncclCommGetAsyncError` (to report a failed PCIe part) — and leaves every
//! other symbol to the real `libnccl.so.2` ([`mod@real`]). Nothing runs at load time; the first
//! intercepted call reads the settings ([`config`]) and finds NCCL, each function on its own:
//! one an older NCCL lacks fails only its own hook (`ncclSystemError`) and what needs it.
//! `AMPCCL_ENABLE=0` makes every hook a plain jump to NCCL.
//!
//! - [`guard`]: re-entry guard, group depth, deferred work, panic boundary;
//! - [`domain`]: domains (per unique id; host identity by arrival) and communicators;
//! - [`split`]: one collective call: plan, PCIe part, NCCL part, join.

#![allow(non_snake_case)]

pub mod config;
pub mod domain;
pub mod guard;
pub mod nccl;
pub mod real;
pub mod report;
pub mod split;

use std::ffi::{c_int, c_void};

use guard::{Deferred, boundary, call_real};
use nccl::{Comm, NcclResult, Stream, UniqueId};
use real::{Missing, Real, real};
use split::Call;

/// Runs `f` with the real NCCL; a function `f` needs that NCCL lacks fails the call.
fn with_real(
    name: &str,
    f: impl FnOnce(&'static Real) -> Result<NcclResult, Missing>,
) -> NcclResult {
    boundary(name, || f(real()).unwrap_or_else(Missing::result))
}

/// Whether a hook should only pass the call on.
fn passthrough() -> bool {
    !config::enabled() || guard::reentered()
}

/// Bookkeeping after NCCL made (or started making) `comm`.
fn made(
    real: &Real,
    r: NcclResult,
    comm: Comm,
    domain: Option<std::sync::Arc<domain::Domain>>,
    rank: usize,
    nranks: usize,
) {
    let (true, false, Some(domain)) = (
        r == nccl::SUCCESS || r == nccl::IN_PROGRESS,
        comm.is_null(),
        domain,
    ) else {
        return;
    };
    let st = domain::register(comm, domain, rank, nranks);
    if guard::in_group() {
        guard::defer(Deferred::Setup(comm));
    } else if r == nccl::SUCCESS {
        // SAFETY: NCCL just made `comm`.
        unsafe { split::setup(real, comm, &st) };
    } // else non-blocking creation: set up at the first split-worthy call.
}

/// The domain for a communicator of `nranks` made from `id`, this rank counted as arrived.
fn arrive_by_id(id: &UniqueId, nranks: c_int) -> Option<std::sync::Arc<domain::Domain>> {
    let n = usize::try_from(nranks).ok().filter(|&n| n > 0)?;
    let _ = config::settings();
    domain::arrive(domain::key_of_id(id, n), n, 1, false)
        .inspect_err(|e| {
            tracing::info!("ampccl: no shared domain, communicator stays fast-only: {e}")
        })
        .ok()
}

/// The body of the `ncclCommInitRank*` hooks: find NCCL's function (`entry`), arrive in the
/// domain of `id` (when there is one), run it (`init`), register the communicator NCCL wrote
/// to `comm`.
fn init_rank<F>(
    name: &str,
    comm: *mut Comm,
    (nranks, rank): (c_int, c_int),
    id: Option<&UniqueId>,
    entry: impl FnOnce(&Real) -> Result<F, Missing>,
    init: impl FnOnce(F) -> NcclResult,
) -> NcclResult {
    with_real(name, |real| {
        // Found first: a call that cannot reach NCCL must not count as an arrival.
        let f = entry(real)?;
        let Some(id) = id.filter(|_| !passthrough() && !comm.is_null()) else {
            return Ok(call_real(|| init(f)));
        };
        let domain = arrive_by_id(id, nranks);
        let r = call_real(|| init(f));
        // SAFETY: `comm` is the non-null out-parameter NCCL has written (or left) on return.
        let made_comm = unsafe { *comm };
        made(real, r, made_comm, domain, rank as usize, nranks as usize);
        Ok(r)
    })
}

/// # Safety
/// NCCL's contract for `ncclCommInitRank`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    // SAFETY: the application's arguments, unchanged.
    init_rank(
        "ncclCommInitRank",
        comm,
        (nranks, rank),
        Some(&id),
        Real::init_rank,
        |f| unsafe { f(comm, nranks, id, rank) },
    )
}

/// # Safety
/// NCCL's contract for `ncclCommInitRankConfig`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: the application's arguments, unchanged.
    init_rank(
        "ncclCommInitRankConfig",
        comm,
        (nranks, rank),
        Some(&id),
        Real::init_rank_config,
        |f| unsafe { f(comm, nranks, id, rank, config) },
    )
}

/// # Safety
/// NCCL's contract for `ncclCommInitRankScalable`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    comm: *mut Comm,
    nranks: c_int,
    rank: c_int,
    n_id: c_int,
    ids: *mut UniqueId,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: `ids` points to `n_id` ids (NCCL's contract); the first names the domain.
    let id = (!ids.is_null() && n_id >= 1).then(|| unsafe { &*ids });
    init_rank(
        "ncclCommInitRankScalable",
        comm,
        (nranks, rank),
        id,
        Real::init_rank_scalable,
        // SAFETY: the application's arguments, unchanged.
        |f| unsafe { f(comm, nranks, rank, n_id, ids, config) },
    )
}

/// # Safety
/// NCCL's contract for `ncclCommInitAll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut Comm,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    with_real("ncclCommInitAll", |real| {
        let init_all = real.init_all()?;
        // SAFETY: the application's arguments, unchanged.
        let r = call_real(|| unsafe { init_all(comms, ndev, devlist) });
        let Ok(n) = usize::try_from(ndev) else {
            return Ok(r);
        };
        if passthrough() || r != nccl::SUCCESS || comms.is_null() || n == 0 {
            return Ok(r);
        }
        let _ = config::settings();
        // One process holds every rank: a private domain under a key no other process has.
        let key = domain::key_of_split(std::process::id() as u64, comms as u64, ndev);
        let Ok(domain) = domain::arrive(key, n, n, true).inspect_err(|e| {
            tracing::info!("ampccl: no domain for ncclCommInitAll, fast-only: {e}")
        }) else {
            return Ok(r);
        };
        for i in 0..n {
            // SAFETY: NCCL filled `ndev` communicators.
            let comm = unsafe { *comms.add(i) };
            made(real, r, comm, Some(domain.clone()), i, n);
        }
        Ok(r)
    })
}

/// # Safety
/// NCCL's contract for `ncclCommSplit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    comm: Comm,
    color: c_int,
    key: c_int,
    newcomm: *mut Comm,
    config: *mut c_void,
) -> NcclResult {
    with_real("ncclCommSplit", |real| {
        // Found first: a split that cannot reach NCCL takes no sequence number.
        let split = real.split()?;
        // SAFETY: the application's arguments, unchanged.
        let call = || call_real(|| unsafe { split(comm, color, key, newcomm, config) });
        let parent = if passthrough() || newcomm.is_null() {
            None
        } else {
            domain::lookup(comm)
        };
        let Some(parent) = parent else {
            return Ok(call());
        };
        // Every rank of the parent splits in the same order: the sequence number, the parent's
        // key and the color name the child domain identically on its ranks.
        let seq = parent
            .splits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let domain = (color != nccl::SPLIT_NOCOLOR)
            .then(|| {
                let child = domain::key_of_split(parent.domain.key, seq, color);
                domain::arrive(child, parent.nranks, 1, false)
                    .inspect_err(|e| tracing::info!("ampccl: no domain for split, fast-only: {e}"))
                    .ok()
            })
            .flatten();
        let r = call();
        // SAFETY: `newcomm` is a valid out-parameter.
        let child = unsafe { *newcomm };
        if child.is_null() || !(r == nccl::SUCCESS || r == nccl::IN_PROGRESS) {
            return Ok(r);
        }
        let (mut rank, mut n) = (-1, 0);
        // Without them the child stays unregistered (fast-only).
        let ok = match (real.user_rank(), real.count()) {
            // SAFETY: `child` is a communicator NCCL made; out-parameters are valid.
            (Ok(user_rank), Ok(count)) => call_real(|| unsafe {
                user_rank(child, &mut rank) == nccl::SUCCESS
                    && count(child, &mut n) == nccl::SUCCESS
            }),
            _ => false,
        };
        if ok && rank >= 0 && n > 0 {
            made(real, r, child, domain, rank as usize, n as usize);
        }
        Ok(r)
    })
}

/// # Safety
/// NCCL's contract for `ncclCommDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDestroy(comm: Comm) -> NcclResult {
    with_real("ncclCommDestroy", |real| {
        // Found first: a communicator NCCL cannot destroy keeps its state.
        let destroy = real.destroy()?;
        if !passthrough()
            && let Some(st) = domain::unregister(comm)
        {
            st.finish();
            // Drops the PCIe resources once their queued work is done; the domain stays.
            drop(st);
        }
        // SAFETY: the application's argument, unchanged.
        Ok(call_real(|| unsafe { destroy(comm) }))
    })
}

/// # Safety
/// NCCL's contract for `ncclCommAbort`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(comm: Comm) -> NcclResult {
    with_real("ncclCommAbort", |real| {
        let abort = real.abort()?;
        if !passthrough()
            && let Some(st) = domain::unregister(comm)
        {
            st.domain.seal();
            // Streams waiting on peers that may be gone are released; the PCIe resources are
            // left to the process (their streams may still hold work that never finishes).
            st.domain.release_waiters();
            std::mem::forget(st);
        }
        // SAFETY: the application's argument, unchanged.
        Ok(call_real(|| unsafe { abort(comm) }))
    })
}

/// NCCL's own asynchronous error, else the failure of a rank's PCIe part during a call on this
/// communicator's domain (`ncclUnhandledCudaError` on that rank, `ncclRemoteError` on the
/// others): results of the calls in flight are undefined, and the application aborts the
/// communicator as after any NCCL error (PyTorch's watchdog polls this).
///
/// # Safety
/// NCCL's contract for `ncclCommGetAsyncError`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: Comm,
    async_error: *mut NcclResult,
) -> NcclResult {
    with_real("ncclCommGetAsyncError", |real| {
        let get = real.async_error()?;
        // SAFETY: the application's arguments, unchanged.
        let r = call_real(|| unsafe { get(comm, async_error) });
        if r != nccl::SUCCESS || async_error.is_null() || passthrough() {
            return Ok(r);
        }
        // SAFETY: NCCL wrote the out-parameter, which the application provided.
        let slot = unsafe { &mut *async_error };
        if *slot == nccl::SUCCESS
            && let Some(st) = domain::lookup(comm)
            && let Some(broken) = st.broken_rank()
        {
            *slot = if broken == st.rank {
                nccl::UNHANDLED_CUDA_ERROR
            } else {
                nccl::REMOTE_ERROR
            };
        }
        Ok(r)
    })
}

/// # Safety
/// NCCL's contract for `ncclGroupStart`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupStart() -> NcclResult {
    with_real("ncclGroupStart", |real| {
        // Found first: a group NCCL cannot open is not counted.
        let start = real.group_start()?;
        if !passthrough() {
            guard::group_enter();
        }
        // SAFETY: no arguments.
        Ok(call_real(|| unsafe { start() }))
    })
}

/// # Safety
/// NCCL's contract for `ncclGroupEnd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupEnd() -> NcclResult {
    with_real("ncclGroupEnd", |real| {
        let end = real.group_end()?;
        // SAFETY: no arguments.
        let mut r = call_real(|| unsafe { end() });
        if passthrough() {
            return Ok(r);
        }
        for work in guard::group_leave() {
            match work {
                Deferred::Setup(comm) => {
                    if let Some(st) = domain::lookup(comm) {
                        // SAFETY: NCCL made `comm` in the group that just ended.
                        unsafe { split::setup(real, comm, &st) };
                    }
                }
                Deferred::Join(comm, stream) => {
                    let j = split::join_deferred(comm, stream);
                    if r == nccl::SUCCESS {
                        r = j;
                    }
                }
            }
        }
        Ok(r)
    })
}

/// Runs a collective hook.
fn collective(name: &str, call: Call, comm: Comm, stream: Stream) -> NcclResult {
    with_real(name, |real| {
        // Found first: a call NCCL cannot take takes no index of the split sequence.
        call.entry(real)?;
        if passthrough() {
            // SAFETY: the application's arguments, unchanged.
            return unsafe { call.full(real, comm, stream) };
        }
        // SAFETY: as above.
        unsafe { split::run(real, call, comm, stream) }
    })
}

/// # Safety
/// NCCL's contract for `ncclAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    comm: Comm,
    stream: Stream,
) -> NcclResult {
    collective(
        "ncclAllReduce",
        Call::AllReduce {
            send,
            recv,
            count,
            dt,
            op,
        },
        comm,
        stream,
    )
}

/// # Safety
/// NCCL's contract for `ncclAllGather`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: c_int,
    comm: Comm,
    stream: Stream,
) -> NcclResult {
    collective(
        "ncclAllGather",
        Call::AllGather {
            send,
            recv,
            count,
            dt,
        },
        comm,
        stream,
    )
}

/// # Safety
/// NCCL's contract for `ncclReduceScatter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    comm: Comm,
    stream: Stream,
) -> NcclResult {
    collective(
        "ncclReduceScatter",
        Call::ReduceScatter {
            send,
            recv,
            count,
            dt,
            op,
        },
        comm,
        stream,
    )
}

/// # Safety
/// NCCL's contract for `ncclBroadcast`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: c_int,
    root: c_int,
    comm: Comm,
    stream: Stream,
) -> NcclResult {
    collective(
        "ncclBroadcast",
        Call::Broadcast {
            send,
            recv,
            count,
            dt,
            root,
        },
        comm,
        stream,
    )
}

/// # Safety
/// NCCL's contract for `ncclReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    comm: Comm,
    stream: Stream,
) -> NcclResult {
    collective(
        "ncclReduce",
        Call::Reduce {
            send,
            recv,
            count,
            dt,
            op,
            root,
        },
        comm,
        stream,
    )
}
