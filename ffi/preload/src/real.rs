//! The real NCCL: its functions, found once, at the first call that needs them.
//!
//! Lookup order: `dlsym(RTLD_NEXT, name)` (NCCL in the global scope: linked by the program, or
//! loaded `RTLD_GLOBAL`); else the already loaded `libnccl.so.2` (`dlopen(RTLD_NOLOAD)`; Python
//! loads it `RTLD_LOCAL` as a dependency of `libtorch_cuda.so`), preferring its strong
//! `pnccl*` aliases; else `$AMPCCL_NCCL_LIBRARY` or `libnccl.so.2` loaded now, locally. A
//! symbol found that is our own (the interposer itself) is never used.

use std::ffi::{CString, c_void};
use std::sync::OnceLock;

use crate::nccl;

/// The NCCL functions the interposer wraps or calls.
pub struct Real {
    pub init_rank: nccl::InitRank,
    pub init_rank_config: nccl::InitRankConfig,
    pub init_rank_scalable: Option<nccl::InitRankScalable>,
    pub init_all: nccl::InitAll,
    pub split: nccl::Split,
    pub destroy: nccl::CommFn,
    pub abort: nccl::CommFn,
    pub async_error: nccl::AsyncError,
    pub cu_device: nccl::CommInt,
    pub user_rank: nccl::CommInt,
    pub count: nccl::CommInt,
    pub group_start: nccl::GroupFn,
    pub group_end: nccl::GroupFn,
    pub all_reduce: nccl::AllReduce,
    pub all_gather: nccl::Gather,
    pub reduce_scatter: nccl::AllReduce,
    pub broadcast: nccl::Broadcast,
    pub reduce: nccl::Reduce,
    pub send: nccl::Send,
    pub recv: nccl::Recv,
}

/// The real functions, or `None` when no NCCL can be found (every wrapped call then fails
/// with `ncclSystemError` and a log line).
pub fn real() -> Option<&'static Real> {
    static REAL: OnceLock<Option<Real>> = OnceLock::new();
    REAL.get_or_init(|| {
        let r = Lookup::new().real();
        if r.is_none() {
            tracing::error!("ampccl preload: the real NCCL (libnccl.so.2) cannot be found; set AMPCCL_NCCL_LIBRARY");
        }
        r
    })
    .as_ref()
}

struct Lookup {
    handle: *mut c_void,
    own: usize,
}

impl Lookup {
    fn new() -> Lookup {
        let own = own_base();
        // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to an already loaded library.
        let mut handle = unsafe {
            libc::dlopen(
                c"libnccl.so.2".as_ptr(),
                libc::RTLD_NOLOAD | libc::RTLD_LAZY,
            )
        };
        if handle.is_null() {
            let path =
                std::env::var("AMPCCL_NCCL_LIBRARY").unwrap_or_else(|_| "libnccl.so.2".into());
            if let Ok(c) = CString::new(path) {
                // SAFETY: loads a shared library by path or name; the handle is kept forever.
                handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            }
        }
        Lookup { handle, own }
    }

    /// Finds `name`, never returning a symbol of this library.
    fn find(&self, name: &str) -> Option<*mut c_void> {
        let plain = CString::new(name).ok()?;
        let profiled = CString::new(format!("p{name}")).ok()?;
        // SAFETY: dlsym with RTLD_NEXT and valid C strings.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, plain.as_ptr()) };
        let mut candidates = vec![next];
        if !self.handle.is_null() {
            // SAFETY: `handle` is a live library handle; names are valid C strings.
            candidates.push(unsafe { libc::dlsym(self.handle, profiled.as_ptr()) });
            // SAFETY: as above.
            candidates.push(unsafe { libc::dlsym(self.handle, plain.as_ptr()) });
        }
        candidates
            .into_iter()
            .find(|p| !p.is_null() && !self.is_own(*p))
    }

    fn is_own(&self, p: *mut c_void) -> bool {
        object_base(p) == Some(self.own)
    }

    fn real(&self) -> Option<Real> {
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                let p = self.find($name)?;
                // SAFETY: NCCL exports `$name` with signature `$ty` (the types in `nccl.rs`
                // follow nccl.h).
                unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
            }};
        }
        let init_rank_scalable = self.find("ncclCommInitRankScalable").map(|p| {
            // SAFETY: as in `sym!`.
            unsafe { std::mem::transmute::<*mut c_void, nccl::InitRankScalable>(p) }
        });
        Some(Real {
            init_rank: sym!("ncclCommInitRank", nccl::InitRank),
            init_rank_config: sym!("ncclCommInitRankConfig", nccl::InitRankConfig),
            init_rank_scalable,
            init_all: sym!("ncclCommInitAll", nccl::InitAll),
            split: sym!("ncclCommSplit", nccl::Split),
            destroy: sym!("ncclCommDestroy", nccl::CommFn),
            abort: sym!("ncclCommAbort", nccl::CommFn),
            async_error: sym!("ncclCommGetAsyncError", nccl::AsyncError),
            cu_device: sym!("ncclCommCuDevice", nccl::CommInt),
            user_rank: sym!("ncclCommUserRank", nccl::CommInt),
            count: sym!("ncclCommCount", nccl::CommInt),
            group_start: sym!("ncclGroupStart", nccl::GroupFn),
            group_end: sym!("ncclGroupEnd", nccl::GroupFn),
            all_reduce: sym!("ncclAllReduce", nccl::AllReduce),
            all_gather: sym!("ncclAllGather", nccl::Gather),
            reduce_scatter: sym!("ncclReduceScatter", nccl::AllReduce),
            broadcast: sym!("ncclBroadcast", nccl::Broadcast),
            reduce: sym!("ncclReduce", nccl::Reduce),
            send: sym!("ncclSend", nccl::Send),
            recv: sym!("ncclRecv", nccl::Recv),
        })
    }
}

/// Base address of the shared object containing `p`.
fn object_base(p: *const c_void) -> Option<usize> {
    // SAFETY: Dl_info is plain data (pointers and integers) for which all-zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only inspects the loaded objects; `info` is a valid out-parameter.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return None;
    }
    Some(info.dli_fbase as usize)
}

/// Base address of this library.
fn own_base() -> usize {
    object_base(own_base as *const c_void).unwrap_or(0)
}
