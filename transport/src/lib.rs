//! ampccl transports.
//!
//! - [`bootstrap`]: unique id, TCP rendezvous, out-of-band allgather/barrier/broadcast;
//!   [`topology::Topology`]: which ranks share a host.
//! - [`device`]: the one-sided RMA device interface; [`protocol`]: NCCL's receiver-driven
//!   protocol over it, [`eager`] its variant for small messages; [`link::Link`]: HCCL's link primitives as stream tasks.
//! - [`transport::Transport`]: a connected provider as a communicator holds it, and
//!   [`transport::connect`], which picks it from the probe list ([`probe`]).
//! - providers: [`shm`] (processes on one host), [`tcp`] (any hosts), [`ofi`] (libfabric's
//!   RMA, any hosts), and [`mixed`]: shared memory within hosts with TCP across them.

pub mod bootstrap;
pub mod device;
pub mod eager;
pub mod handback;
pub mod hold;
pub mod link;
pub mod mixed;
pub mod ofi;
pub mod oplog;
pub mod probe;
pub mod protocol;
pub mod shm;
pub mod tcp;
#[cfg(test)]
pub(crate) mod testdev;
pub mod topology;
pub mod transport;

pub use ampccl_runtime::{Error, Result};

use ampccl_runtime::param::Param;

/// The transports' parameters ([`Param`], docs/TUNING.md): the TCP provider's connections per
/// pair, stripe size and polled sockets' low-water mark, the `ofi` provider's rails, the
/// protocol's stripe size over several channels, how long small frames are held back. The
/// other constants here are layout (the shared-memory segment's, a cache line of credit
/// words), bounds that keep the bootstrap from deadlocking, or choices of code that runs only
/// at initialization; docs/TUNING.md ("Fixed constants") says why each stays fixed.
pub fn params() -> Vec<&'static Param> {
    vec![
        &tcp::stripe::NSOCKS,
        &tcp::stripe::STRIPE_MIN,
        &tcp::POLLED_LOWAT,
        &ofi::RAILS,
        &ofi::WRITES_COMPLETE_MAX,
        &protocol::STRIPE_MIN,
        &hold::HOLD,
    ]
}
