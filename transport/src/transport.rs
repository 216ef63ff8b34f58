//! The transport as a communicator holds it (NCCL's transport vtable): a connected provider
//! that is an [`RmaDevice`] for the links' protocol, plus what the communicator needs around
//! the operations — its CCL window, its doorbell, the failure flag peers watch, and the
//! operation record peers compare against theirs.
//!
//! [`connect`] picks the provider from the probe list ([`crate::probe`]) and connects it: the
//! shared-memory provider ([`crate::shm`]), libfabric's RMA ([`crate::ofi`]) or TCP
//! ([`crate::tcp`]); the communicator never
//! names a concrete provider.

use std::sync::Arc;

use ampccl_runtime::Result;
use ampccl_runtime::doorbell::Doorbell;

use crate::bootstrap::Bootstrap;
use crate::device::{OpRecord, RmaDevice};
use crate::probe::{self, Provider};
use crate::shm::{self, ShmConfig, ShmDevice};
use crate::{mixed, ofi, tcp};

/// Formats a peer's operation record for a mismatch error (`None`: not a record).
pub type OpFormatter = fn(&[u64]) -> Option<String>;

/// A connected transport provider.
pub trait Transport: RmaDevice {
    /// The provider's name (`AMPCCL_TRANSPORT`'s values).
    fn name(&self) -> &'static str;
    /// The doorbell an idle engine of this rank sleeps on (peers ring it when they write).
    fn doorbell(&self) -> Doorbell;
    /// This rank's registered window, `(base, len)`: the communicator's CCL buffers, which
    /// peers write into.
    fn window(&self) -> (*mut u8, usize);
    /// Whether peers reach this rank's user buffers directly (so links may receive into and
    /// send from user memory without the window).
    fn user_mem_links(&self) -> bool;
    /// Whether `len` bytes at `ptr` lie in memory the peers have mapped (shared user memory).
    fn is_shared_user_memory(&self, ptr: *const u8, len: usize) -> bool;
    /// Publishes the record of the operation this rank runs (peers check it against theirs
    /// and describe it on mismatch).
    fn set_op(&self, record: &OpRecord);
    /// Sets how peers' operation records are described in errors (once).
    fn set_op_formatter(&self, f: OpFormatter);
    /// Marks this rank failed with `msg`, so that peers stop waiting for it.
    fn mark_failed(&self, msg: &str);
    /// The error of the first peer that marked itself failed.
    fn check_peers_failed(&self) -> Result<()>;
    /// Sends the small frames the provider has held back ([`crate::hold`]) for
    /// [`crate::hold::HOLD`] or longer; the engine calls it when it finds nothing to do
    /// (providers that hold nothing back ignore it).
    fn flush(&self) {}
    /// The engine's driver is about to sleep on the doorbell after its last look: the provider
    /// sends every frame it holds back, and one whose receiving thread stands back while the
    /// engine polls (so as not to take its core) hands that thread the connections back, so
    /// that what arrives next rings the doorbell.
    fn driver_sleeps(&self) {}
    /// Whether the provider holds frames back or stands its receiving thread back while the
    /// engine polls (and needs [`Transport::flush`] and [`Transport::driver_sleeps`] at all).
    fn holds_frames_back(&self) -> bool {
        false
    }
}

/// What a communicator asks of its transport.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Bytes of this rank's registered window (the CCL buffers).
    pub window: usize,
    /// Clear-to-send FIFO depth.
    pub fifo_depth: usize,
    /// Whether cross-memory attach may be used where the kernel permits it.
    pub allow_cma: bool,
    /// The provider `AMPCCL_TRANSPORT` forces, if any.
    pub forced: Option<String>,
    /// `AMPCCL_SHM_DISABLE`: ranks of one host use the network provider too.
    pub shm_disable: bool,
}

/// Connects the ranks of `boot`: the forced provider, else shared memory when every rank is on
/// this host, `ofi` when asked for or on an RDMA fabric, TCP when every host has one rank (or
/// shared memory is disabled), and shared memory within each host with TCP across hosts
/// otherwise ([`crate::mixed`]).
pub fn connect(boot: &Bootstrap, cfg: &TransportConfig) -> Result<Arc<dyn Transport>> {
    let provider = probe::select(boot, cfg.forced.as_deref(), cfg.shm_disable)?;
    let say = |how: &str| {
        if boot.rank() == 0 {
            tracing::info!("{} connected by {how}", boot.topology().summary());
        }
    };
    match provider {
        Provider::Shm => {
            say(provider.name());
            let shm_cfg = ShmConfig {
                window: cfg.window,
                depth: cfg.fifo_depth,
                allow_cma: cfg.allow_cma,
                names: Vec::new(),
            };
            Ok(shm::connect(boot, &shm_cfg)?)
        }
        Provider::Ofi => {
            match ofi::connect(boot, cfg, probe::ofi_is_auto(cfg.forced.as_deref()))? {
                Some(dev) => {
                    say(provider.name());
                    Ok(dev)
                }
                None => connect_tcp(boot, cfg, say),
            }
        }
        Provider::Tcp => connect_tcp(boot, cfg, say),
    }
}

/// TCP between every pair, or, on several hosts some of which hold several ranks, shared
/// memory within each host and TCP across.
fn connect_tcp(
    boot: &Bootstrap,
    cfg: &TransportConfig,
    say: impl Fn(&str),
) -> Result<Arc<dyn Transport>> {
    let topo = boot.topology();
    let mixed = cfg.forced.is_none()
        && !cfg.shm_disable
        && topo.hosts() > 1
        && topo.ranks_per_host() != Some(1);
    if mixed {
        say("shared memory within hosts, tcp across");
        return Ok(mixed::connect(boot, cfg)?);
    }
    say(Provider::Tcp.name());
    Ok(tcp::connect(boot, cfg)?)
}

impl Transport for ShmDevice {
    fn name(&self) -> &'static str {
        Provider::Shm.name()
    }
    fn doorbell(&self) -> Doorbell {
        ShmDevice::doorbell(self)
    }
    fn window(&self) -> (*mut u8, usize) {
        ShmDevice::window(self)
    }
    fn user_mem_links(&self) -> bool {
        self.uses_cma()
    }
    fn is_shared_user_memory(&self, ptr: *const u8, len: usize) -> bool {
        shm::shared::find(ptr, len).is_some()
    }
    fn set_op(&self, record: &OpRecord) {
        ShmDevice::set_op(self, record)
    }
    fn set_op_formatter(&self, f: OpFormatter) {
        ShmDevice::set_op_formatter(self, f)
    }
    fn mark_failed(&self, msg: &str) {
        ShmDevice::mark_failed(self, msg)
    }
    fn check_peers_failed(&self) -> Result<()> {
        ShmDevice::check_peers_failed(self)
    }
}
