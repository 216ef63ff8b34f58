//! Communicator handles: init (blocking, non-blocking, several ranks in one process), split,
//! destroy, abort, and the queries (async error, count, rank).
//!
//! A handle (`ampcclComm_t`) is a `Box<ampcclComm>` holding an `Arc<CommShared>`, whose state
//! moves `Initializing → Ready | Failed`, and `→ Aborted` on `ampcclCommAbort`. Non-blocking
//! inits (and inits inside a group) run on a thread of their own that stores the outcome.
//! Abort releases the communicator but keeps the handle, so `ampcclCommDestroy` after
//! `ampcclCommAbort` is safe (and frees the handle's few bytes, which a program that only
//! aborts leaks). Destroying a handle twice is the caller's bug, as with NCCL.

use std::ffi::{CStr, c_int};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ampccl_native::registry::Registry;
use ampccl_native::{Communicator, Config, Error, Event, UniqueId};

use crate::error::{FfiResult, invalid};
use crate::group;
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;

/// Where a communicator is in its life.
pub(crate) enum State {
    Initializing,
    Ready(Communicator),
    Failed(Error),
    Aborted,
}

/// What a handle points to (shared with the init thread and pending group operations).
pub(crate) struct CommShared {
    state: Mutex<State>,
    init: Mutex<Option<JoinHandle<()>>>,
    /// Completion of the latest operation issued through the C ABI.
    last: Mutex<Option<Event>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CommShared {
    fn new(state: State) -> Arc<CommShared> {
        Arc::new(CommShared {
            state: Mutex::new(state),
            init: Mutex::new(None),
            last: Mutex::new(None),
        })
    }

    /// The communicator, if it is ready to run operations.
    pub(crate) fn ready(&self) -> FfiResult<Communicator> {
        match &*lock(&self.state) {
            State::Ready(c) => Ok(c.clone()),
            State::Initializing => Err(Error::InvalidUsage(
                "the communicator is still initializing: poll ampcclCommGetAsyncError until it \
                 returns ampcclSuccess"
                    .into(),
            )),
            State::Failed(e) => Err(Error::InvalidUsage(format!(
                "the communicator failed to initialize: {e}"
            ))),
            State::Aborted => Err(Error::InvalidUsage("the communicator was aborted".into())),
        }
    }

    /// Remembers the completion event of the latest operation.
    pub(crate) fn note(&self, ev: Event) {
        *lock(&self.last) = Some(ev);
    }

    /// Blocks until a pending init has finished; returns its error, if any.
    pub(crate) fn wait_init(&self) -> FfiResult {
        if let Some(h) = lock(&self.init).take() {
            h.join()
                .map_err(|_| Error::Internal("the init thread panicked".into()))?;
        }
        match &*lock(&self.state) {
            State::Failed(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Stores the outcome of an init (aborting it at once if the handle was aborted meanwhile).
    fn finish_init(&self, r: FfiResult<Communicator>) {
        let mut st = lock(&self.state);
        match (&*st, r) {
            (State::Aborted, Ok(c)) => c.abort(),
            (State::Aborted, Err(_)) => {}
            (_, Ok(c)) => *st = State::Ready(c),
            (_, Err(e)) => *st = State::Failed(e),
        }
    }
}

/// Options read from an `ampcclConfig_t`.
pub(crate) struct Options {
    pub blocking: bool,
    pub timeout: Option<Duration>,
    pub name: String,
}

/// Checks and reads `cfg` (NULL: defaults).
///
/// # Safety
/// `cfg` is NULL or points to a readable `ampcclConfig_t`.
pub(crate) unsafe fn options(cfg: *const ampcclConfig_t) -> FfiResult<Options> {
    let mut o = Options {
        blocking: true,
        timeout: None,
        name: String::new(),
    };
    // SAFETY: the caller guarantees NULL or a valid config.
    let Some(c) = (unsafe { cfg.as_ref() }) else {
        return Ok(o);
    };
    if c.magic != AMPCCL_API_MAGIC || c.size != size_of::<ampcclConfig_t>() {
        return Err(invalid(format!(
            "config has size {} and magic {:#x}: initialize it with AMPCCL_CONFIG_INITIALIZER",
            c.size, c.magic
        )));
    }
    o.blocking = match c.blocking {
        AMPCCL_CONFIG_UNDEF_INT | 1 => true,
        0 => false,
        b => return Err(invalid(format!("config.blocking is {b}: must be 0 or 1"))),
    };
    match c.timeoutS {
        AMPCCL_CONFIG_UNDEF_INT => {}
        t if t > 0 => o.timeout = Some(Duration::from_secs(t as u64)),
        t => return Err(invalid(format!("config.timeoutS is {t}: must be positive"))),
    }
    if !c.commName.is_null() {
        // SAFETY: a non-NULL commName is a NUL-terminated string (the config's contract).
        o.name = unsafe { CStr::from_ptr(c.commName) }
            .to_string_lossy()
            .into_owned();
    }
    Ok(o)
}

/// Turns `shared` into a handle.
fn handle(shared: Arc<CommShared>) -> ampcclComm_t {
    Box::into_raw(Box::new(ampcclComm { shared }))
}

/// The handle behind `comm`.
///
/// # Safety
/// `comm` is NULL or a live handle.
pub(crate) unsafe fn comm_ref<'a>(comm: ampcclComm_t) -> FfiResult<&'a ampcclComm> {
    // SAFETY: forwarded from the caller.
    unsafe { comm.as_ref() }.ok_or_else(|| invalid("comm is NULL"))
}

/// Runs `job` (an init) inline when blocking outside a group, else on a thread; stores the new
/// handle in `*out`.
fn start(
    out: &mut ampcclComm_t,
    blocking: bool,
    job: impl FnOnce() -> FfiResult<Communicator> + Send + 'static,
) -> FfiResult<ampcclResult_t> {
    if blocking && !group::active() {
        *out = handle(CommShared::new(State::Ready(job()?)));
        return Ok(ampcclSuccess);
    }
    let shared = CommShared::new(State::Initializing);
    let s2 = shared.clone();
    let h = std::thread::Builder::new()
        .name("ampccl-init".into())
        .spawn(move || s2.finish_init(job()))
        .map_err(|e| Error::system("spawn the init thread", e))?;
    *lock(&shared.init) = Some(h);
    if group::active() {
        group::add_init(shared.clone(), blocking);
    }
    *out = handle(shared);
    Ok(if blocking {
        ampcclSuccess
    } else {
        ampcclInProgress
    })
}

/// `ampcclCommInitRankConfig`.
///
/// # Safety
/// Pointers are NULL or valid for their types.
pub(crate) unsafe fn init_rank(
    out: *mut ampcclComm_t,
    nranks: c_int,
    id: *const ampcclUniqueId,
    rank: c_int,
    cfg: *const ampcclConfig_t,
) -> FfiResult<ampcclResult_t> {
    // SAFETY: forwarded from the caller.
    let out = unsafe { out.as_mut() }.ok_or_else(|| invalid("comm (output) is NULL"))?;
    // SAFETY: forwarded from the caller.
    let id = unsafe { id.as_ref() }.ok_or_else(|| invalid("unique id is NULL"))?;
    if nranks < 1 {
        return Err(invalid(format!("nranks is {nranks}: must be at least 1")));
    }
    if rank < 0 || rank >= nranks {
        return Err(invalid(format!("rank {rank} is not in [0, {nranks})")));
    }
    // SAFETY: forwarded from the caller.
    let opts = unsafe { options(cfg)? };
    let bytes: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
    let id = UniqueId::from_bytes(&bytes)?;
    let mut config = Config::from_env()?;
    if let Some(t) = opts.timeout {
        config.timeout = t;
    }
    if !opts.name.is_empty() {
        tracing::info!("init of {:?}: rank {rank} of {nranks}", opts.name);
    }
    let (rank, world) = (rank as usize, nranks as usize);
    start(out, opts.blocking, move || {
        Communicator::init_with(&id, rank, world, config, Registry::builtin())
    })
}

/// `ampcclCommInitFromEnv`.
///
/// # Safety
/// `out` is NULL or valid for a write.
pub(crate) unsafe fn init_from_env(out: *mut ampcclComm_t) -> FfiResult<ampcclResult_t> {
    // SAFETY: forwarded from the caller.
    let out = unsafe { out.as_mut() }.ok_or_else(|| invalid("comm (output) is NULL"))?;
    start(out, true, Communicator::from_env)
}

/// `ampcclCommInitAll`: `ndev` ranks of one new communicator in this process, each initialized
/// on its own thread.
///
/// # Safety
/// `comms` is NULL or valid for `ndev` writes.
pub(crate) unsafe fn init_all(comms: *mut ampcclComm_t, ndev: c_int) -> FfiResult<ampcclResult_t> {
    if comms.is_null() {
        return Err(invalid("comms is NULL"));
    }
    if ndev < 1 {
        return Err(invalid(format!("ndev is {ndev}: must be at least 1")));
    }
    let id = UniqueId::generate()?;
    let threads: Vec<_> = (0..ndev as usize)
        .map(|r| std::thread::spawn(move || Communicator::init(&id, r, ndev as usize)))
        .collect();
    let results: Vec<FfiResult<Communicator>> = threads
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap_or_else(|_| Err(Error::Internal("an init thread panicked".into())))
        })
        .collect();
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err().cloned()) {
        for c in results.into_iter().flatten() {
            c.abort();
        }
        return Err(e);
    }
    for (i, c) in results.into_iter().flatten().enumerate() {
        // SAFETY: `comms` holds `ndev` slots (the caller's contract); i < ndev.
        unsafe { *comms.add(i) = handle(CommShared::new(State::Ready(c))) };
    }
    Ok(ampcclSuccess)
}

/// `ampcclCommSplit`.
///
/// # Safety
/// Pointers are NULL or valid for their types; `comm` is a live handle.
pub(crate) unsafe fn split(
    comm: ampcclComm_t,
    color: c_int,
    key: c_int,
    out: *mut ampcclComm_t,
    cfg: *const ampcclConfig_t,
) -> FfiResult<ampcclResult_t> {
    // SAFETY: forwarded from the caller.
    let parent = unsafe { comm_ref(comm)? }.shared.ready()?;
    // SAFETY: forwarded from the caller.
    let out = unsafe { out.as_mut() }.ok_or_else(|| invalid("newcomm is NULL"))?;
    if color < 0 && color != AMPCCL_SPLIT_NOCOLOR {
        return Err(invalid(format!(
            "color {color} is negative and not AMPCCL_SPLIT_NOCOLOR"
        )));
    }
    // SAFETY: forwarded from the caller.
    let opts = unsafe { options(cfg)? };
    if color == AMPCCL_SPLIT_NOCOLOR {
        // This rank joins no communicator, but the split is collective: take part, then say so.
        parent.split(color, key)?;
        *out = std::ptr::null_mut();
        return Ok(ampcclSuccess);
    }
    start(out, opts.blocking, move || {
        parent
            .split(color, key)?
            .ok_or_else(|| Error::Internal("split with a color returned no communicator".into()))
    })
}

/// `ampcclCommDestroy`: waits for the communicator's operations, then frees the handle.
///
/// # Safety
/// `comm` is NULL or a live handle, not used again after this call.
pub(crate) unsafe fn destroy(comm: ampcclComm_t) -> FfiResult<ampcclResult_t> {
    if comm.is_null() {
        return Err(invalid("comm is NULL"));
    }
    // SAFETY: a live handle made by `handle` (Box::into_raw); the caller gives it up.
    let b = unsafe { Box::from_raw(comm) };
    let _ = b.shared.wait_init();
    let st = std::mem::replace(&mut *lock(&b.shared.state), State::Aborted);
    match st {
        State::Ready(c) => c.destroy().map(|()| ampcclSuccess),
        _ => Ok(ampcclSuccess),
    }
}

/// `ampcclCommAbort`: stops everything now; the handle stays valid for `ampcclCommDestroy`.
///
/// # Safety
/// `comm` is NULL or a live handle.
pub(crate) unsafe fn abort(comm: ampcclComm_t) -> FfiResult<ampcclResult_t> {
    // SAFETY: forwarded from the caller.
    let h = unsafe { comm_ref(comm)? };
    let st = std::mem::replace(&mut *lock(&h.shared.state), State::Aborted);
    if let State::Ready(c) = st {
        c.abort();
    }
    *lock(&h.shared.last) = None;
    Ok(ampcclSuccess)
}

/// `ampcclCommGetAsyncError`: the communicator's state as a result code.
pub(crate) fn async_error(h: &ampcclComm) -> ampcclResult_t {
    let err = match &*lock(&h.shared.state) {
        State::Initializing => return ampcclInProgress,
        State::Ready(c) => c.async_error(),
        State::Failed(e) => Some(e.clone()),
        State::Aborted => Some(Error::Aborted("the communicator was aborted".into())),
    };
    match err {
        None => ampcclSuccess,
        Some(e) => {
            let code = crate::error::code_of(&e);
            crate::error::set_last_error(&e.to_string());
            code
        }
    }
}

/// `ampcclCommSynchronize`: waits for every operation issued on `h` so far.
pub(crate) fn synchronize(h: &ampcclComm) -> FfiResult<ampcclResult_t> {
    h.shared.ready()?;
    let last = lock(&h.shared.last).clone();
    if let Some(ev) = last {
        crate::stream::wait(&[ev])?;
    }
    Ok(ampcclSuccess)
}
