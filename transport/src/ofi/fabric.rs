//! One opened libfabric domain and what hangs off it: the provider's description, fabric,
//! domain, address vector, completion queues (with a file-descriptor wait object where the
//! provider offers one) and one or more reliable-datagram endpoints (*rails*: each has its own
//! connections to the peers' rails, and large writes are striped over them), plus memory
//! registrations. Every rail shares the address vector. With manual progress, rail 0, which
//! carries the messages and every transfer of one stripe, completes on queue 0, and the other
//! rails, which carry only the further stripes of large transfers, share queue 1: a read of a
//! queue drives only its own rails (over `ofi_rxm` each rail's endpoint on every read, a
//! system call per idle rail), so the device reads queue 1 only while a transfer cut into
//! stripes may use it ([`super::state::State::progress`]). With automatic progress all rails
//! share one queue. Every call into the data path goes through the function tables of these
//! objects, as the inline functions of libfabric's headers do ([`super::sys`]); those calls
//! are in [`ops`].
//!
//! An [`Endpoint`] is not synchronized: the device calls it under one lock (the domain is
//! opened with `FI_THREAD_DOMAIN`).

use std::ffi::{CString, c_int, c_void};
use std::os::fd::RawFd;
use std::ptr::{null, null_mut};

use rand::TryRngCore;

use super::sys::{self, Fid, Lib};

mod ops;

/// What the provider offers, as the device needs it.
#[derive(Clone, Debug)]
pub struct Caps {
    /// libfabric's provider name (`tcp;ofi_rxm`, `shm`, ...).
    pub provider: String,
    /// Registered memory is addressed by virtual address (else by offset).
    pub virt_addr: bool,
    /// The provider picks memory keys (else the application does).
    pub prov_key: bool,
    /// Local buffers of sends, receives, writes and reads must be registered too
    /// (`FI_MR_LOCAL`, as `verbs` and `efa` ask; `AMPCCL_OFI_MR_LOCAL=1` registers them where
    /// the provider does not ask, which runs that path over socket providers).
    pub local_mr: bool,
    /// Data progress is manual (only our calls move data).
    pub manual: bool,
    /// Bytes of remote completion data a message or write carries (at least 4).
    pub cq_data: usize,
}

/// How a thread with nothing to do waits for the completion queues (`AMPCCL_OFI_WAIT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Queues with a file-descriptor wait object (`FI_WAIT_FD`) where the provider offers
    /// one: an idle thread blocks on it (`fi_trywait`, then `poll`).
    Fd,
    /// Queues without a wait object: threads poll them, an idle one with naps between looks.
    /// A wait object can cost the provider work on every poll (libfabric 1.17's `tcp` then
    /// finds ready sockets through `epoll_wait` on its wait set instead of `poll` on them: 5–10 %
    /// of an 8-byte ping-pong, docs/TUNING.md), which a host with a core per rank may rather
    /// spend polling, as MPI libraries and fabtests do.
    Poll,
}

/// An opened domain with its rails.
pub struct Endpoint {
    lib: &'static Lib,
    info: *mut sys::Info,
    fabric: *mut sys::FidFabric,
    domain: *mut sys::FidDomain,
    av: *mut sys::FidAv,
    /// Queue 0 (rail 0) and, with more rails, queue 1 (the others).
    cqs: Vec<*mut sys::FidCq>,
    /// The rails; messages go on rail 0.
    eps: Vec<*mut sys::FidEp>,
    /// Every queue's wait descriptor, or none ([`Wait::Poll`], or a queue without one: the
    /// device then polls, napping while idle).
    wait_fds: Vec<RawFd>,
    /// The last application-chosen memory key (random start: peers cannot guess keys).
    last_key: u64,
    pub caps: Caps,
}

// SAFETY: the handles are plain pointers into libfabric; the device serializes every call on
// one endpoint under a lock, as FI_THREAD_DOMAIN asks.
unsafe impl Send for Endpoint {}

/// A memory registration, closed on drop.
pub struct Mr {
    mr: *mut sys::FidMr,
    /// The key a peer names the memory by.
    pub key: u64,
}

impl Mr {
    /// The descriptor local operations on the memory pass (`fi_mr_desc`).
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: a live registration this value owns.
        unsafe { (*self.mr).mem_desc }
    }
}

/// The descriptor of `mr`, or none.
pub fn desc(mr: &Option<Mr>) -> *mut c_void {
    mr.as_ref().map_or(null_mut(), Mr::desc)
}

// SAFETY: a registration handle; closed once, on drop, under the endpoint's lock (it lives in
// the device's locked state).
unsafe impl Send for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: `mr` is a live registration this value owns; closed once.
        unsafe { close(self.mr.cast()) };
    }
}

/// Closes a libfabric object through its table.
///
/// # Safety
/// `fid` must be NULL or a live object, not used afterwards.
unsafe fn close(fid: *mut Fid) {
    if !fid.is_null() {
        // SAFETY: a live object's `ops` table holds `close`.
        unsafe { ((*(*fid).ops).close)(fid) };
    }
}

/// Which libfabric provider to open.
#[derive(Clone, Copy, Debug)]
pub enum Pick<'a> {
    /// The provider of this name (`tcp;ofi_rxm`, `verbs;ofi_rxm`, `efa`, ...).
    Named(&'a str),
    /// The first suitable one.
    First,
    /// The first suitable one whose core provider (the name before any `;`) is listed.
    Among(&'a [String]),
}

impl Pick<'_> {
    fn accepts(&self, name: &str) -> bool {
        match self {
            Pick::Named(_) | Pick::First => true,
            Pick::Among(cores) => {
                let core = name.split(';').next().unwrap_or(name);
                cores.iter().any(|c| c == core)
            }
        }
    }
}

/// The provider descriptions of `fi_getinfo` for reliable-datagram endpoints with messages
/// delivered in order and RMA (the named provider's only, if `pick` names one): the first
/// that `pick` accepts and that carries at least 4 bytes of remote completion data.
fn getinfo(lib: &Lib, pick: Pick) -> Result<*mut sys::Info, String> {
    let provider = match pick {
        Pick::Named(p) => Some(p),
        _ => None,
    };
    // SAFETY: fi_dupinfo(NULL) allocates zeroed hints with all attribute structs (what
    // fi_allocinfo does); every field set below exists in the 1.x layout.
    let hints = unsafe { (lib.dupinfo)(null()) };
    if hints.is_null() {
        return Err("fi_allocinfo failed".into());
    }
    // SAFETY: `hints` and its attribute structs were allocated by libfabric above; the name
    // is malloc'ed so that fi_freeinfo may free it.
    unsafe {
        let h = &mut *hints;
        h.caps = sys::FI_MSG | sys::FI_RMA;
        h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
        (*h.ep_attr).ep_type = sys::FI_EP_RDM;
        // The protocol takes a peer's messages in the order they were sent: a later
        // clear-to-send for a slot replaces an earlier one, a credit follows the message it
        // frees. A provider that may reorder them does not match.
        (*h.tx_attr).msg_order = sys::FI_ORDER_SAS;
        (*h.rx_attr).msg_order = sys::FI_ORDER_SAS;
        let d = &mut *h.domain_attr;
        d.mr_mode =
            sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY;
        d.threading = sys::FI_THREAD_DOMAIN;
        d.av_type = sys::FI_AV_TABLE;
        if let Some(p) = provider {
            let name = CString::new(p).map_err(|_| format!("provider name {p:?}"))?;
            (*h.fabric_attr).prov_name = libc::strdup(name.as_ptr());
        }
    }
    let mut list = null_mut();
    // SAFETY: valid hints, an out pointer; the list is freed below or by the caller.
    let rc = unsafe { (lib.getinfo)(sys::API_VERSION, null(), null(), 0, hints, &mut list) };
    // SAFETY: allocated by libfabric above, not used again.
    unsafe { (lib.freeinfo)(hints) };
    if rc != 0 {
        return Err(format!(
            "no provider with reliable datagrams, ordered messages and RMA{}: {}",
            provider.map(|p| format!(" named {p}")).unwrap_or_default(),
            lib.strerror(rc.into())
        ));
    }
    let mut cur = list;
    let mut found = null_mut();
    while !cur.is_null() {
        // SAFETY: a node of the list fi_getinfo returned.
        let (d, name) = unsafe {
            (
                &*(*cur).domain_attr,
                sys::text((*(*cur).fabric_attr).prov_name),
            )
        };
        if d.cq_data_size >= 4 && pick.accepts(&name) {
            // SAFETY: as above; the copy is freed by the endpoint.
            found = unsafe { (lib.dupinfo)(cur) };
            break;
        }
        // SAFETY: as above.
        cur = unsafe { (*cur).next };
    }
    // SAFETY: the list fi_getinfo returned, not used again.
    unsafe { (lib.freeinfo)(list) };
    if found.is_null() {
        return Err(match pick {
            Pick::Among(cores) => format!(
                "no provider of {} with reliable datagrams, RMA and 4 bytes of remote \
                 completion data",
                cores.join(", ")
            ),
            _ => "no provider carries 4 bytes of remote completion data".into(),
        });
    }
    Ok(found)
}

/// A random start for application-chosen memory keys, below 2^62 (keys count up from it).
fn random_key() -> Result<u64, String> {
    let mut key = [0u8; 8];
    rand::rngs::OsRng
        .try_fill_bytes(&mut key)
        .map_err(|e| format!("the OS random number generator: {e}"))?;
    Ok(u64::from_le_bytes(key) >> 2)
}

/// Fails with libfabric's message for a negative return code.
fn check(lib: &Lib, what: &str, rc: c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what}: {}", lib.strerror(rc.into())))
    }
}

/// Opens a completion queue of `domain`: for [`Wait::Fd`] with a file-descriptor wait
/// object, with that descriptor (where the provider offers none, one without); for
/// [`Wait::Poll`] one without.
///
/// # Safety
/// `domain` must be a live domain opened through `lib`.
unsafe fn open_cq(
    lib: &Lib,
    domain: *mut sys::FidDomain,
    wait: Wait,
) -> Result<(*mut sys::FidCq, Option<RawFd>), String> {
    let mut attr = sys::CqAttr {
        size: 0,
        flags: 0,
        format: sys::FI_CQ_FORMAT_DATA,
        wait_obj: sys::FI_WAIT_FD,
        signaling_vector: 0,
        wait_cond: 0,
        wait_set: null_mut(),
    };
    let mut cq = null_mut();
    // SAFETY: a live domain's `ops` table holds `cq_open`; `attr` and `cq` are valid out and
    // in pointers; a CQ that opened is live for its `control`.
    unsafe {
        let ops = (*domain).ops;
        if wait == Wait::Fd && ((*ops).cq_open)(domain, &mut attr, &mut cq, null_mut()) == 0 {
            let mut fd: c_int = -1;
            let fid = &mut (*cq).fid;
            let rc = ((*fid.ops).control)(fid, sys::FI_GETWAIT, (&mut fd as *mut c_int).cast());
            return Ok((cq, (rc == 0 && fd >= 0).then_some(fd)));
        }
        // No file descriptor to block on: the device polls, napping while idle.
        cq = null_mut();
        attr.wait_obj = 0;
        let rc = ((*ops).cq_open)(domain, &mut attr, &mut cq, null_mut());
        check(lib, "fi_cq_open", rc)?;
    }
    Ok((cq, None))
}

impl Endpoint {
    /// Opens endpoints of the provider `pick` picks: as many as `rails` asks for that
    /// provider (at least one), whose queues idle threads wait for as `wait` says.
    pub fn open(
        lib: &'static Lib,
        pick: Pick,
        rails: impl Fn(&Caps) -> usize,
        wait: Wait,
    ) -> Result<Endpoint, String> {
        sys::keeping_signal_handlers(|| Endpoint::open_inner(lib, pick, &rails, wait))
    }

    fn open_inner(
        lib: &'static Lib,
        pick: Pick,
        rails: &dyn Fn(&Caps) -> usize,
        wait: Wait,
    ) -> Result<Endpoint, String> {
        let info = getinfo(lib, pick)?;
        // SAFETY: `info` is a valid description (getinfo).
        let caps = unsafe {
            let d = &*(*info).domain_attr;
            Caps {
                provider: sys::text((*(*info).fabric_attr).prov_name),
                virt_addr: d.mr_mode & sys::FI_MR_VIRT_ADDR != 0,
                prov_key: d.mr_mode & sys::FI_MR_PROV_KEY != 0,
                local_mr: d.mr_mode & sys::FI_MR_LOCAL != 0
                    || std::env::var("AMPCCL_OFI_MR_LOCAL").is_ok_and(|v| v == "1"),
                manual: d.data_progress == sys::FI_PROGRESS_MANUAL,
                cq_data: d.cq_data_size,
            }
        };
        let rails = rails(&caps).max(1);
        let mut e = Endpoint {
            lib,
            info,
            fabric: null_mut(),
            domain: null_mut(),
            av: null_mut(),
            cqs: Vec::with_capacity(2),
            eps: Vec::with_capacity(rails),
            wait_fds: Vec::with_capacity(2),
            last_key: random_key()?,
            caps,
        };
        // Each step stores its object in `e` at once, so that an error drops what exists.
        // SAFETY: the calls follow libfabric's opening order with the objects opened before;
        // out pointers are fields of `e`.
        unsafe {
            check(
                lib,
                "fi_fabric",
                (lib.fabric)((*info).fabric_attr, &mut e.fabric, null_mut()),
            )?;
            let f = &*e.fabric;
            check(
                lib,
                "fi_domain",
                ((*f.ops).domain)(e.fabric, info, &mut e.domain, null_mut()),
            )?;
            let dom = &*e.domain;
            let mut av_attr = sys::AvAttr {
                av_type: sys::FI_AV_TABLE,
                rx_ctx_bits: 0,
                count: 0,
                ep_per_node: 0,
                name: null(),
                map_addr: null_mut(),
                flags: 0,
            };
            check(
                lib,
                "fi_av_open",
                ((*dom.ops).av_open)(e.domain, &mut av_attr, &mut e.av, null_mut()),
            )?;
            // A queue of its own for rail 0 only where our reads drive the rails (manual
            // progress): with automatic progress the split measured no gain
            // (docs/TUNING.md, "Fixed constants").
            let queues = if rails > 1 && e.caps.manual { 2 } else { 1 };
            let mut waits = true;
            for _ in 0..queues {
                let (cq, fd) = open_cq(lib, e.domain, wait)?;
                e.cqs.push(cq);
                waits &= fd.is_some();
                e.wait_fds.extend(fd);
            }
            if !waits {
                // One queue without a descriptor: blocking on the others could miss it.
                e.wait_fds.clear();
            }
            for rail in 0..rails {
                let mut ep = null_mut();
                check(
                    lib,
                    "fi_endpoint",
                    ((*dom.ops).endpoint)(e.domain, info, &mut ep, null_mut()),
                )?;
                e.eps.push(ep);
                let ep = &mut (*ep).fid;
                check(lib, "fi_ep_bind(av)", ((*ep.ops).bind)(ep, e.av.cast(), 0))?;
                check(
                    lib,
                    "fi_ep_bind(cq)",
                    ((*ep.ops).bind)(
                        ep,
                        e.cqs[e.queue_of(rail)].cast(),
                        sys::FI_TRANSMIT | sys::FI_RECV,
                    ),
                )?;
                check(
                    lib,
                    "fi_enable",
                    ((*ep.ops).control)(ep, sys::FI_ENABLE, null_mut()),
                )?;
            }
        }
        Ok(e)
    }

    /// How many rails are open.
    pub fn rails(&self) -> usize {
        self.eps.len()
    }

    /// Closes the rails: from here on the provider neither delivers into our posted receives
    /// and registered regions nor reads our buffers (with automatic progress its own thread
    /// does so at any time while a rail is open), so they may be freed. Nothing may be posted
    /// afterwards.
    pub fn close_rails(&mut self) {
        for ep in self.eps.drain(..) {
            // SAFETY: a live endpoint this value owns, closed once (drained from the list).
            unsafe { close(ep.cast()) };
        }
    }

    /// The library's message for error `rc`.
    pub fn strerror(&self, rc: i64) -> String {
        self.lib.strerror(rc)
    }

    /// The library's version.
    pub fn version(&self) -> String {
        self.lib.version()
    }

    /// How many completion queues there are (2 with more than one rail and manual progress,
    /// else 1).
    pub fn queues(&self) -> usize {
        self.cqs.len()
    }

    /// The completion queue of rail `rail`: queue 0 for rail 0 (messages and transfers of one
    /// stripe), queue 1, where there is one, for the others (further stripes).
    pub fn queue_of(&self, rail: usize) -> usize {
        rail.min(self.cqs.len() - 1)
    }

    /// The descriptors that become readable when a completion queue may have work, one per
    /// queue (none without wait objects).
    pub fn wait_fds(&self) -> &[RawFd] {
        &self.wait_fds
    }

    /// Rail `rail`'s address, for peers' address vectors.
    pub fn name(&self, rail: usize) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        let ep = self.eps[rail];
        // SAFETY: an enabled endpoint's `cm` table holds `getname`; `buf` holds `len` bytes.
        let rc =
            unsafe { ((*(*ep).cm).getname)(&mut (*ep).fid, buf.as_mut_ptr().cast(), &mut len) };
        check(self.lib, "fi_getname", rc)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts one peer's address; its handle for sends and writes.
    pub fn insert(&self, addr: &[u8]) -> Result<sys::FiAddr, String> {
        let mut out: sys::FiAddr = sys::FI_ADDR_UNSPEC;
        // SAFETY: a live address vector; `addr` is one address in the provider's format (the
        // peer's `name`), `out` receives one handle.
        let n = unsafe {
            ((*(*self.av).ops).insert)(self.av, addr.as_ptr().cast(), 1, &mut out, 0, null_mut())
        };
        if n != 1 {
            return Err(format!("fi_av_insert: {}", self.lib.strerror(n.into())));
        }
        Ok(out)
    }

    /// Registers `[ptr, ptr + len)` for `access`: peers' (`FI_REMOTE_WRITE`/`FI_REMOTE_READ`)
    /// or our own operations' (`FI_SEND`, `FI_RECV`, `FI_WRITE`, `FI_READ`), under a fresh
    /// application key unless the provider picks keys.
    pub fn register(&mut self, ptr: *const u8, len: usize, access: u64) -> Result<Mr, String> {
        self.last_key = self.last_key.wrapping_add(1);
        let key = self.last_key;
        let mut mr = null_mut();
        // SAFETY: a live domain's `mr` table holds `reg`; the memory stays valid while the
        // registration lives (the device closes it when the transfer completes).
        let rc = unsafe {
            ((*(*self.domain).mr).reg)(
                &mut (*self.domain).fid,
                ptr.cast(),
                len,
                access,
                0,
                key,
                0,
                &mut mr,
                null_mut(),
            )
        };
        check(self.lib, "fi_mr_reg", rc)?;
        // SAFETY: a registration fi_mr_reg returned.
        let key = unsafe { (*mr).key };
        Ok(Mr { mr, key })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: each object is NULL or live and owned by `self`; closed once, endpoints first
        // (they are bound to the CQ and AV), the description freed last.
        unsafe {
            for &ep in &self.eps {
                close(ep.cast());
            }
            for &cq in &self.cqs {
                close(cq.cast());
            }
            close(self.av.cast());
            close(self.domain.cast());
            close(self.fabric.cast());
            (self.lib.freeinfo)(self.info);
        }
    }
}
