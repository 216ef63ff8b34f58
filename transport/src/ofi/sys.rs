//! The part of libfabric's 1.x ABI the provider uses, declared by hand and loaded at run time.
//!
//! libfabric exports only a few functions (`fi_getinfo`, `fi_freeinfo`, `fi_dupinfo`,
//! `fi_fabric`, `fi_strerror`, `fi_version`); everything else (opening domains, endpoints,
//! completion queues, posting writes) is an inline function of its headers that calls through a
//! table of function pointers stored in the object (`fid_ep::rma->write`, ...). The structs below
//! mirror `rdma/fabric.h`, `fi_domain.h`, `fi_endpoint.h`, `fi_rma.h` and `fi_eq.h` of the 1.x
//! API (the layouts are append-only across 1.x and kept by 2.x for 1.x callers); only the
//! fields and tables the provider touches are spelled out, the rest are opaque pointers.
//! `fi_info` structures are only ever allocated by libfabric (`fi_dupinfo(NULL)`), so a newer
//! library's longer structs are fine.
//!
//! [`Lib::load`] opens `libfabric.so.1` with `dlopen`: a machine without libfabric builds and
//! runs, and the provider then reports no device.

use std::ffi::{CStr, c_char, c_int, c_void};

/// The API version the provider asks for: 1.17, the oldest library it runs with (Debian 12's).
pub const API_VERSION: u32 = (1 << 16) | 17;

pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
/// Operation modes the provider honours: every operation gets a `fi_context2`-sized context.
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;

pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;

/// Message ordering: a peer's sends arrive in the order they were posted.
pub const FI_ORDER_SAS: u64 = 1 << 8;

pub const FI_EP_RDM: c_int = 3;
pub const FI_AV_TABLE: c_int = 2;
pub const FI_CQ_FORMAT_DATA: c_int = 3;
pub const FI_WAIT_FD: c_int = 3;
pub const FI_THREAD_DOMAIN: c_int = 3;
pub const FI_PROGRESS_MANUAL: c_int = 2;

/// `fi_control` commands.
pub const FI_GETWAIT: c_int = 5;
pub const FI_ENABLE: c_int = 6;
/// `fi_ep_bind` flags for a completion queue.
pub const FI_TRANSMIT: u64 = FI_SEND;

pub const FI_EAGAIN: isize = libc::EAGAIN as isize;
pub const FI_EAVAIL: isize = 259;

pub type FiAddr = u64;
pub const FI_ADDR_UNSPEC: FiAddr = u64::MAX;

#[repr(C)]
pub struct Fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *const FiOps,
}

#[repr(C)]
pub struct FiOps {
    pub size: usize,
    pub close: unsafe extern "C" fn(*mut Fid) -> c_int,
    pub bind: unsafe extern "C" fn(*mut Fid, *mut Fid, u64) -> c_int,
    pub control: unsafe extern "C" fn(*mut Fid, c_int, *mut c_void) -> c_int,
}

#[repr(C)]
pub struct TxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct RxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
pub struct EpAttr {
    pub ep_type: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    // Further fields are not used.
}

#[repr(C)]
pub struct DomainAttr {
    pub domain: *mut c_void,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    // Further fields are not used.
}

#[repr(C)]
pub struct FabricAttr {
    pub fabric: *mut c_void,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[repr(C)]
pub struct Info {
    pub next: *mut Info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut Fid,
    pub tx_attr: *mut TxAttr,
    pub rx_attr: *mut RxAttr,
    pub ep_attr: *mut EpAttr,
    pub domain_attr: *mut DomainAttr,
    pub fabric_attr: *mut FabricAttr,
    pub nic: *mut c_void,
}

#[repr(C)]
pub struct OpsFabric {
    pub size: usize,
    pub domain:
        unsafe extern "C" fn(*mut FidFabric, *mut Info, *mut *mut FidDomain, *mut c_void) -> c_int,
    pub passive_ep: *const c_void,
    pub eq_open: *const c_void,
    pub wait_open: *const c_void,
    pub trywait: unsafe extern "C" fn(*mut FidFabric, *mut *mut Fid, c_int) -> c_int,
}

#[repr(C)]
pub struct FidFabric {
    pub fid: Fid,
    pub ops: *const OpsFabric,
}

#[repr(C)]
pub struct AvAttr {
    pub av_type: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

#[repr(C)]
pub struct CqAttr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
pub struct OpsDomain {
    pub size: usize,
    pub av_open:
        unsafe extern "C" fn(*mut FidDomain, *mut AvAttr, *mut *mut FidAv, *mut c_void) -> c_int,
    pub cq_open:
        unsafe extern "C" fn(*mut FidDomain, *mut CqAttr, *mut *mut FidCq, *mut c_void) -> c_int,
    pub endpoint:
        unsafe extern "C" fn(*mut FidDomain, *mut Info, *mut *mut FidEp, *mut c_void) -> c_int,
}

#[repr(C)]
pub struct OpsMr {
    pub size: usize,
    #[allow(clippy::type_complexity)]
    pub reg: unsafe extern "C" fn(
        *mut Fid,
        *const c_void,
        usize,
        u64,
        u64,
        u64,
        u64,
        *mut *mut FidMr,
        *mut c_void,
    ) -> c_int,
}

#[repr(C)]
pub struct FidDomain {
    pub fid: Fid,
    pub ops: *const OpsDomain,
    pub mr: *const OpsMr,
}

#[repr(C)]
pub struct FidMr {
    pub fid: Fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

#[repr(C)]
pub struct OpsAv {
    pub size: usize,
    pub insert: unsafe extern "C" fn(
        *mut FidAv,
        *const c_void,
        usize,
        *mut FiAddr,
        u64,
        *mut c_void,
    ) -> c_int,
}

#[repr(C)]
pub struct FidAv {
    pub fid: Fid,
    pub ops: *const OpsAv,
}

#[repr(C)]
pub struct CqDataEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
}

#[repr(C)]
pub struct CqErrEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
    /// Room for fields a newer library may append.
    pub _reserved: [u64; 8],
}

#[repr(C)]
pub struct OpsCq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut FidCq, *mut c_void, usize) -> isize,
    pub readfrom: *const c_void,
    pub readerr: unsafe extern "C" fn(*mut FidCq, *mut CqErrEntry, u64) -> isize,
}

#[repr(C)]
pub struct FidCq {
    pub fid: Fid,
    pub ops: *const OpsCq,
}

#[repr(C)]
pub struct OpsCm {
    pub size: usize,
    pub setname: *const c_void,
    pub getname: unsafe extern "C" fn(*mut Fid, *mut c_void, *mut usize) -> c_int,
}

#[repr(C)]
pub struct OpsMsg {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut FidEp,
        *mut c_void,
        usize,
        *mut c_void,
        FiAddr,
        *mut c_void,
    ) -> isize,
    pub recvv: *const c_void,
    pub recvmsg: *const c_void,
    pub send: unsafe extern "C" fn(
        *mut FidEp,
        *const c_void,
        usize,
        *mut c_void,
        FiAddr,
        *mut c_void,
    ) -> isize,
    pub sendv: *const c_void,
    pub sendmsg: *const c_void,
    pub inject: *const c_void,
    pub senddata: unsafe extern "C" fn(
        *mut FidEp,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        FiAddr,
        *mut c_void,
    ) -> isize,
}

#[repr(C)]
pub struct OpsRma {
    pub size: usize,
    #[allow(clippy::type_complexity)]
    pub read: unsafe extern "C" fn(
        *mut FidEp,
        *mut c_void,
        usize,
        *mut c_void,
        FiAddr,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub readv: *const c_void,
    pub readmsg: *const c_void,
    #[allow(clippy::type_complexity)]
    pub write: unsafe extern "C" fn(
        *mut FidEp,
        *const c_void,
        usize,
        *mut c_void,
        FiAddr,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub writev: *const c_void,
    pub writemsg: *const c_void,
    pub inject: *const c_void,
    #[allow(clippy::type_complexity)]
    pub writedata: unsafe extern "C" fn(
        *mut FidEp,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        FiAddr,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
}

#[repr(C)]
pub struct FidEp {
    pub fid: Fid,
    pub ops: *const c_void,
    pub cm: *const OpsCm,
    pub msg: *const OpsMsg,
    pub rma: *const OpsRma,
}

/// The operation context libfabric may use as scratch space (`struct fi_context2`).
#[repr(C)]
#[derive(Default)]
pub struct Context2 {
    pub internal: [usize; 8],
}

type GetInfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const Info,
    *mut *mut Info,
) -> c_int;

/// The exported functions of a loaded libfabric.
pub struct Lib {
    pub getinfo: GetInfo,
    pub freeinfo: unsafe extern "C" fn(*mut Info),
    pub dupinfo: unsafe extern "C" fn(*const Info) -> *mut Info,
    pub fabric: unsafe extern "C" fn(*mut FabricAttr, *mut *mut FidFabric, *mut c_void) -> c_int,
    strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    version: unsafe extern "C" fn() -> u32,
}

impl Lib {
    /// Loads `libfabric.so.1` (kept loaded for the life of the process); the reason when it is
    /// missing or lacks a function.
    pub fn load() -> Result<Lib, String> {
        const NAME: &CStr = c"libfabric.so.1";
        // SAFETY: a NUL-terminated name; the handle is never closed, so the functions found
        // below stay valid for the life of the process.
        let handle = keeping_signal_handlers(|| unsafe {
            libc::dlopen(NAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL)
        });
        if handle.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated message owned by libc.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "not found".to_string()
            } else {
                // SAFETY: non-NULL, NUL-terminated (above).
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("cannot load libfabric.so.1: {why}"));
        }
        let sym = |name: &CStr| {
            // SAFETY: `handle` is a live dlopen handle, `name` NUL-terminated.
            let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if f.is_null() {
                Err(format!("libfabric.so.1 lacks {}", name.to_string_lossy()))
            } else {
                Ok(f)
            }
        };
        // SAFETY: each symbol is the exported C function of that name, whose signature in the
        // 1.x API (fabric.h, fi_errno.h) the target type spells out.
        unsafe {
            Ok(Lib {
                getinfo: std::mem::transmute::<*mut c_void, GetInfo>(sym(c"fi_getinfo")?),
                freeinfo: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Info)>(sym(
                    c"fi_freeinfo",
                )?),
                dupinfo: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*const Info) -> *mut Info,
                >(sym(c"fi_dupinfo")?),
                fabric: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(
                        *mut FabricAttr,
                        *mut *mut FidFabric,
                        *mut c_void,
                    ) -> c_int,
                >(sym(c"fi_fabric")?),
                strerror: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(c_int) -> *const c_char,
                >(sym(c"fi_strerror")?),
                version: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u32>(sym(
                    c"fi_version",
                )?),
            })
        }
    }

    /// libfabric's message for the (positive) error number `err`.
    pub fn strerror(&self, err: i64) -> String {
        let err = err.unsigned_abs().min(i32::MAX as u64) as c_int;
        // SAFETY: fi_strerror returns a static NUL-terminated string for any number.
        let s = unsafe { (self.strerror)(err) };
        if s.is_null() {
            return format!("error {err}");
        }
        // SAFETY: non-NULL, NUL-terminated, static.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// The library's version as `major.minor`.
    pub fn version(&self) -> String {
        // SAFETY: fi_version takes nothing and returns a number.
        let v = unsafe { (self.version)() };
        format!("{}.{}", v >> 16, v & 0xffff)
    }
}

/// Runs `f` (a call that may initialize libfabric's providers) and puts back this process's
/// handlers of the crash signals afterwards: some libraries libfabric loads (the PSM ones of
/// Debian's build) install their own at load time, which print a backtrace and `exit(1)`,
/// turning an abort into a plain exit and overriding the application's handlers.
pub fn keeping_signal_handlers<T>(f: impl FnOnce() -> T) -> T {
    const SIGNALS: [c_int; 5] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGABRT,
    ];
    // SAFETY: sigaction is plain data; zero is a valid initial value.
    let mut saved: [libc::sigaction; 5] = unsafe { std::mem::zeroed() };
    for (sig, old) in SIGNALS.iter().zip(saved.iter_mut()) {
        // SAFETY: reads the current disposition into `old`.
        unsafe { libc::sigaction(*sig, std::ptr::null(), old) };
    }
    let out = f();
    for (sig, old) in SIGNALS.iter().zip(saved.iter()) {
        // SAFETY: restores a disposition read above.
        unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
    }
    out
}

/// A NUL-terminated C string as text (empty for NULL).
///
/// # Safety
/// `s` must be NULL or point to a NUL-terminated string.
pub unsafe fn text(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}
