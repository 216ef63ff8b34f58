//! The real NCCL: each of its functions found on its own, at the first call that needs it.
//!
//! Lookup order: `dlsym(RTLD_NEXT, name)` (NCCL in the global scope: linked by the program, or
//! loaded `RTLD_GLOBAL`); else the already loaded `libnccl.so.2` (`dlopen(RTLD_NOLOAD)`; Python
//! loads it `RTLD_LOCAL` as a dependency of `libtorch_cuda.so`), preferring its strong
//! `pnccl*` aliases; else `$AMPCCL_NCCL_LIBRARY` or `libnccl.so.2` loaded now, locally. A
//! symbol found that is our own (the interposer itself) is never used.
//!
//! An older or partial NCCL lacks some functions (`ncclCommAbort` and `ncclCommGetAsyncError`
//! came with 2.4, `ncclSend`/`ncclRecv` with 2.7, `ncclCommInitRankConfig` with 2.14,
//! `ncclCommSplit` with 2.18, `ncclCommInitRankScalable` with 2.23). A function it lacks is
//! [`Missing`], logged once by name, and only what needs it fails: the hook of that name
//! answers [`Missing::result`] (`ncclSystemError`, what NCCL itself answers when a function it
//! loads with `dlsym` is absent), and the PCIe path stays off where it needs it (see
//! `split::setup` and `Call::split_needs`). Every function the library does export passes
//! through, `AMPCCL_ENABLE=0` or not.

use std::ffi::{CString, c_void};
use std::sync::OnceLock;

use crate::nccl::{self, NcclResult};

/// A function the real NCCL does not export (its name). Logged when first looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missing(pub &'static str);

impl Missing {
    /// What a hook answers when the real function it forwards to is missing.
    pub fn result(self) -> NcclResult {
        nccl::SYSTEM_ERROR
    }
}

/// Finds a function by name (an address, never one of this library).
type Finder = Box<dyn Fn(&str) -> Option<usize> + Send + Sync>;

macro_rules! entry_points {
    ($($field:ident: $ty:ty = $name:literal,)*) => {
        /// The NCCL functions the interposer wraps or calls, each looked up on its own at its
        /// first use (a missing one fails only its own callers).
        pub struct Real {
            find: Finder,
            /// Whether any NCCL was found at all (for the log line of a missing function).
            found: bool,
            $($field: OnceLock<Option<usize>>,)*
        }

        impl Real {
            fn new(find: Finder, found: bool) -> Real {
                Real { find, found, $($field: OnceLock::new(),)* }
            }

            $(
                #[doc = concat!("`", $name, "`, unless this NCCL lacks it.")]
                pub fn $field(&self) -> Result<$ty, Missing> {
                    let p = self.resolve(&self.$field, $name)?;
                    // SAFETY: NCCL exports `$name` with signature `$ty` (the types in
                    // `nccl.rs` follow nccl.h); `p` is the address of that function.
                    Ok(unsafe { std::mem::transmute::<*mut c_void, $ty>(p as *mut c_void) })
                }
            )*
        }
    };
}

entry_points! {
    init_rank: nccl::InitRank = "ncclCommInitRank",
    init_rank_config: nccl::InitRankConfig = "ncclCommInitRankConfig",
    init_rank_scalable: nccl::InitRankScalable = "ncclCommInitRankScalable",
    init_all: nccl::InitAll = "ncclCommInitAll",
    split: nccl::Split = "ncclCommSplit",
    destroy: nccl::CommFn = "ncclCommDestroy",
    abort: nccl::CommFn = "ncclCommAbort",
    async_error: nccl::AsyncError = "ncclCommGetAsyncError",
    cu_device: nccl::CommInt = "ncclCommCuDevice",
    user_rank: nccl::CommInt = "ncclCommUserRank",
    count: nccl::CommInt = "ncclCommCount",
    group_start: nccl::GroupFn = "ncclGroupStart",
    group_end: nccl::GroupFn = "ncclGroupEnd",
    all_reduce: nccl::AllReduce = "ncclAllReduce",
    all_gather: nccl::Gather = "ncclAllGather",
    reduce_scatter: nccl::AllReduce = "ncclReduceScatter",
    broadcast: nccl::Broadcast = "ncclBroadcast",
    reduce: nccl::Reduce = "ncclReduce",
    send: nccl::Send = "ncclSend",
    recv: nccl::Recv = "ncclRecv",
}

impl Real {
    /// The address of `name`, looked up once; a missing one is logged (once, here).
    fn resolve(
        &self,
        slot: &OnceLock<Option<usize>>,
        name: &'static str,
    ) -> Result<usize, Missing> {
        slot.get_or_init(|| {
            let p = (self.find)(name);
            if p.is_none() {
                log_missing(name, self.found);
            }
            p
        })
        .ok_or(Missing(name))
    }

    /// A table whose functions are those of `present` (each a function that must never be
    /// called), for tests of what a missing function turns off.
    #[cfg(test)]
    pub fn with_only(present: &'static [&'static str]) -> Real {
        extern "C" fn never() {
            unreachable!("a stand-in entry point was called");
        }
        let find = move |name: &str| {
            present
                .contains(&name)
                .then_some(never as *const () as usize)
        };
        Real::new(Box::new(find), true)
    }
}

fn log_missing(name: &str, found: bool) {
    // Logged whatever the settings (`AMPCCL_ENABLE=0` never reads them).
    ampccl_runtime::log::init_logging();
    if found {
        tracing::warn!(
            "ampccl preload: the real NCCL does not export {name} (an older or partial \
             release): a call of it through the interposer fails with ncclSystemError, and \
             the PCIe path stays off where it needs it"
        );
    } else {
        tracing::error!(
            "ampccl preload: the real NCCL (libnccl.so.2) cannot be found, so neither can \
             {name} (it fails with ncclSystemError); set AMPCCL_NCCL_LIBRARY"
        );
    }
}

/// The real functions (the library is looked for at the first call).
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| {
        let lookup = Lookup::new();
        let found = lookup.find("ncclGetUniqueId").is_some();
        Real::new(
            Box::new(move |name| lookup.find(name).map(|p| p as usize)),
            found,
        )
    })
}

struct Lookup {
    handle: *mut c_void,
    own: usize,
}

// SAFETY: the handle is only passed to `dlsym`, which is thread-safe, and never closed.
unsafe impl Send for Lookup {}
// SAFETY: as above.
unsafe impl Sync for Lookup {}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_function_is_found_or_missing_on_its_own() {
        let real = Real::with_only(&["ncclAllReduce", "ncclGroupStart"]);
        assert!(real.all_reduce().is_ok() && real.group_start().is_ok());
        assert_eq!(real.split().err(), Some(Missing("ncclCommSplit")));
        assert_eq!(real.split().err(), Some(Missing("ncclCommSplit")), "cached");
        assert_eq!(real.send().err(), Some(Missing("ncclSend")));
        assert!(real.all_reduce().is_ok(), "a missing one breaks no other");
        assert_eq!(Missing("ncclCommSplit").result(), nccl::SYSTEM_ERROR);
    }
}
