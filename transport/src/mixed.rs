//! Shared memory within each host, TCP across hosts, in one communicator: a device that routes
//! every peer to the provider that connects that pair (NCCL's per-pair transport choice).
//!
//! The shared-memory device serves the ranks of this host (over a bootstrap subgroup of them),
//! the TCP device the ranks of other hosts; both deliver into the one window of this rank (the
//! shared-memory segment's, which the TCP device accepts like any memory) and ring the one
//! doorbell the engine sleeps on (the segment's). A clear-to-send carries memory the way its
//! peer's provider names it: for a shared-memory peer the segment's key and offset, for a TCP
//! peer the address. Messages of either provider name ranks by their communicator rank.

use std::sync::Arc;

use ampccl_runtime::doorbell::Doorbell;
use ampccl_runtime::task::CopyTo;
use ampccl_runtime::{Error, Result};

use crate::bootstrap::Bootstrap;
use crate::device::{CtsEntry, EagerHeader, OpRecord, RmaDevice};
use crate::shm::{self, ShmConfig, ShmDevice};
use crate::tcp::{self, TcpDevice};
use crate::transport::{OpFormatter, Transport, TransportConfig};

/// Which provider serves a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Shared memory, the peer's index in the host's device.
    Shm(usize),
    Tcp,
}

/// Shared memory within the host, TCP to the other hosts.
pub struct MixedDevice {
    shm: Arc<ShmDevice>,
    tcp: Arc<TcpDevice>,
    route: Vec<Route>,
}

/// Connects this rank to its host's ranks over shared memory and to the others over TCP.
pub fn connect(boot: &Bootstrap, cfg: &TransportConfig) -> Result<Arc<MixedDevice>> {
    const TAG_LOCAL: u64 = 0x4d49_5800_0000_0000;
    let topo = boot.topology();
    let local = topo.local_ranks().to_vec();
    let host = boot.subgroup(&local, TAG_LOCAL)?;
    let shm = shm::connect(
        &host,
        &ShmConfig {
            window: cfg.window,
            depth: cfg.fifo_depth,
            allow_cma: cfg.allow_cma,
            names: local.clone(),
        },
    )?;
    let remote: Vec<bool> = (0..boot.world()).map(|r| !topo.is_local(r)).collect();
    let tcp = tcp::connect_to(boot, cfg, &remote, shm.doorbell(), 0)?;
    let route = (0..boot.world())
        .map(|r| match local.iter().position(|&l| l == r) {
            Some(i) => Route::Shm(i),
            None => Route::Tcp,
        })
        .collect();
    Ok(Arc::new(MixedDevice { shm, tcp, route }))
}

impl MixedDevice {
    fn route(&self, peer: usize) -> Route {
        self.route[peer]
    }
}

/// Calls `$method` on the provider that serves `$peer`, with the peer's index there.
macro_rules! routed {
    ($self:ident, $peer:expr, |$dev:ident, $p:ident| $call:expr) => {
        match $self.route($peer) {
            Route::Shm($p) => {
                let $dev: &ShmDevice = &$self.shm;
                $call
            }
            Route::Tcp => {
                let ($dev, $p): (&TcpDevice, usize) = (&$self.tcp, $peer);
                $call
            }
        }
    };
}

impl RmaDevice for MixedDevice {
    fn fifo_depth(&self) -> usize {
        self.shm.fifo_depth()
    }

    fn channels(&self) -> usize {
        1
    }

    /// Any memory either provider can expose, named by its address; `post_cts` turns it into
    /// the receiving peer's provider's naming.
    fn expose(&self, ptr: *mut u8, _len: usize) -> Option<(u32, u64)> {
        Some((0, ptr as u64))
    }

    fn exposes_user_memory(&self) -> bool {
        self.shm.exposes_user_memory()
    }

    fn post_cts(&self, peer: usize, slot: usize, entry: &CtsEntry) -> Result<()> {
        match self.route(peer) {
            Route::Tcp => self.tcp.post_cts(peer, slot, entry),
            Route::Shm(p) => {
                let ptr = entry.addr as *mut u8;
                let len = entry.size as usize;
                let named = if len == 0 {
                    Some(self.shm.expose(ptr, 0).unwrap_or((0, 0)))
                } else {
                    self.shm.expose(ptr, len)
                };
                let Some((key, addr)) = named else {
                    return Err(Error::Internal(format!(
                        "buffer {ptr:p}+{len} is not in a registered window"
                    )));
                };
                self.shm.post_cts(
                    p,
                    slot,
                    &CtsEntry {
                        key,
                        addr,
                        ..*entry
                    },
                )
            }
        }
    }

    fn poll_cts(&self, peer: usize, slot: usize, idx: u32) -> Option<CtsEntry> {
        routed!(self, peer, |d, p| d.poll_cts(p, slot, idx))
    }

    unsafe fn write(
        &self,
        peer: usize,
        src: *const u8,
        len: usize,
        key: u32,
        addr: u64,
    ) -> Result<()> {
        // SAFETY: forwarded.
        routed!(self, peer, |d, p| unsafe {
            d.write(p, src, len, key, addr)
        })
    }

    unsafe fn read(
        &self,
        peer: usize,
        dst: *mut u8,
        len: usize,
        key: u32,
        addr: u64,
        to: CopyTo,
    ) -> Result<()> {
        // SAFETY: forwarded.
        routed!(self, peer, |d, p| unsafe {
            d.read(p, dst, len, key, addr, to)
        })
    }

    fn write_imm(&self, peer: usize, slot: usize, imm: u32, len: u64) -> Result<()> {
        routed!(self, peer, |d, p| d.write_imm(p, slot, imm, len))
    }

    fn send_done(&self, peer: usize, slot: usize) -> bool {
        routed!(self, peer, |d, p| d.send_done(p, slot))
    }

    fn poll_imm(&self, peer: usize, slot: usize, want: u32) -> Option<(u32, u64)> {
        routed!(self, peer, |d, p| d.poll_imm(p, slot, want))
    }

    /// The smaller of the two: every rank computes the same, so both sides of a link agree on
    /// which messages travel eagerly.
    fn eager_max(&self) -> usize {
        self.shm.eager_max().min(self.tcp.eager_max())
    }

    unsafe fn eager_write(
        &self,
        peer: usize,
        slot: usize,
        idx: u32,
        tag: u32,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded.
        routed!(self, peer, |d, p| unsafe {
            d.eager_write(p, slot, idx, tag, src, len)
        })
    }

    fn eager_peek(&self, peer: usize, slot: usize, idx: u32) -> Option<EagerHeader> {
        routed!(self, peer, |d, p| d.eager_peek(p, slot, idx))
    }

    unsafe fn eager_read(&self, peer: usize, slot: usize, dst: *mut u8, len: usize) {
        // SAFETY: forwarded.
        routed!(self, peer, |d, p| unsafe {
            d.eager_read(p, slot, dst, len)
        })
    }

    fn post_credit(&self, peer: usize, slot: usize, seq: u32) -> Result<()> {
        routed!(self, peer, |d, p| d.post_credit(p, slot, seq))
    }

    fn credit(&self, peer: usize, slot: usize) -> u32 {
        routed!(self, peer, |d, p| d.credit(p, slot))
    }

    fn credit_group(&self, peer: usize, first: usize, out: &mut [u32]) {
        routed!(self, peer, |d, p| d.credit_group(p, first, out))
    }

    fn post_ack(&self, peer: usize) -> Result<()> {
        routed!(self, peer, |d, p| d.post_ack(p))
    }

    fn acks(&self, peer: usize) -> u32 {
        routed!(self, peer, |d, p| d.acks(p))
    }

    fn peer_health(&self, peer: usize) -> Result<()> {
        self.check_peers_failed()?;
        routed!(self, peer, |d, p| d.peer_health(p))
    }

    fn peer_desc(&self, peer: usize) -> String {
        routed!(self, peer, |d, p| d.peer_desc(p))
    }

    fn op_history(&self, peer: Option<usize>) -> Vec<OpRecord> {
        match peer {
            None => self.shm.op_history(None),
            Some(peer) => routed!(self, peer, |d, p| d.op_history(Some(p))),
        }
    }

    fn peer_op(&self, peer: usize, tag: u32) -> Option<String> {
        routed!(self, peer, |d, p| d.peer_op(p, tag))
    }

    fn local_op(&self, tag: u32) -> Option<String> {
        self.shm.local_op(tag)
    }
}

impl Transport for MixedDevice {
    fn name(&self) -> &'static str {
        "shm+tcp"
    }
    fn doorbell(&self) -> Doorbell {
        Transport::doorbell(&*self.shm)
    }
    fn window(&self) -> (*mut u8, usize) {
        Transport::window(&*self.shm)
    }
    fn user_mem_links(&self) -> bool {
        self.shm.user_mem_links()
    }
    fn is_shared_user_memory(&self, ptr: *const u8, len: usize) -> bool {
        self.shm.is_shared_user_memory(ptr, len)
    }
    fn set_op(&self, record: &OpRecord) {
        Transport::set_op(&*self.shm, record);
        Transport::set_op(&*self.tcp, record);
    }
    fn set_op_formatter(&self, f: OpFormatter) {
        Transport::set_op_formatter(&*self.shm, f);
        Transport::set_op_formatter(&*self.tcp, f);
    }
    fn flush(&self) {
        Transport::flush(&*self.tcp);
    }
    fn driver_sleeps(&self) {
        Transport::driver_sleeps(&*self.tcp);
    }
    fn holds_frames_back(&self) -> bool {
        true
    }
    fn mark_failed(&self, msg: &str) {
        Transport::mark_failed(&*self.shm, msg);
        Transport::mark_failed(&*self.tcp, msg);
    }
    fn check_peers_failed(&self) -> Result<()> {
        Transport::check_peers_failed(&*self.shm)?;
        Transport::check_peers_failed(&*self.tcp)
    }
}
