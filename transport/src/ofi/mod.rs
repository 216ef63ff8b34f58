//! The `ofi` provider: the RMA device interface ([`crate::device::RmaDevice`]) on libfabric's
//! reliable-datagram endpoints with RMA, the interface through which MPI implementations and
//! NCCL's AWS plugin reach InfiniBand, RoCE and EFA (libfabric's `verbs` and `efa` providers),
//! and which its `tcp;ofi_rxm`, `tcp` and `shm` providers offer over sockets and shared memory.
//!
//! libfabric is loaded at run time ([`sys`]): without it the provider reports no device. Rank 0
//! picks the libfabric provider (`AMPCCL_OFI_PROVIDER`, else the first with reliable datagrams,
//! messages delivered in the order sent, RMA and at least 4 bytes of remote completion data),
//! every rank opens an endpoint of it ([`fabric`]) and the ranks swap endpoint addresses
//! through the bootstrap.
//!
//! The receiver-driven protocol maps onto it as on an RDMA NIC:
//! - a clear-to-send registers the memory it names (`fi_mr_reg`, with a fresh random
//!   application key or the provider's key, for remote writes, or reads for a read offer) and
//!   travels as a small message ([`wire`]) carrying the key; the entry's key becomes its FIFO
//!   slot, under which the sender finds the memory key and the region's bounds;
//! - data goes as `fi_writedata` into that region, each write carrying 32 bits of remote
//!   completion data (the writer's rank and the slot), so the receiver counts the writes that
//!   landed;
//! - up to `AMPCCL_OFI_WRITES_COMPLETE_MAX` (64 KiB) the writes complete the transfer by
//!   themselves, as a write with immediate data does on an RDMA NIC: the clear-to-send says
//!   so ([`wire::CTS_WRITES_COMPLETE`]), the receiver knows how many writes its entry asked
//!   for, and the last to land publishes the transfer. Larger transfers (and failed ones)
//!   send the immediate as a message naming how many writes it completes: the receive
//!   completes once both are in, whatever order the provider delivered them in. (Over the
//!   kernel's sockets the message measured faster for large transfers under BBR:
//!   docs/TUNING.md.) Either way the region's registration then closes. The send is done
//!   (its buffer free) once its writes complete on the queue
//!   ([`crate::device::RmaDevice::send_done`]), so the engine goes on meanwhile;
//! - eager messages, credits, acks and failure notes are messages into receives posted for
//!   any sender; each message names its sender's rank (a message naming no peer is dropped);
//!   an eager payload that fits the provider's message limit (`ofi_rxm`'s bounce buffer)
//!   only without our header goes alone, its header in the 64-bit completion data
//!   ([`wire::Compact`]);
//! - large writes are cut into stripes over several endpoints (*rails*, `AMPCCL_OFI_RAILS`)
//!   of one domain, each with its own connections where the provider runs over sockets.
//!   With manual progress rail 0 completes on one queue and the others on a second one,
//!   read only while a transfer cut into stripes may use them (over `ofi_rxm` every read
//!   drives each rail of its queue, a system call per idle rail). Stripe `k` of a transfer goes on rail `k`, so a transfer of
//!   one stripe always takes rail 0 and each connection carries a steady share instead of a
//!   burst now and then. Over the kernel's TCP connections the rail count follows the
//!   host's congestion control ([`setup::rails_for`]): several paced (BBR) connections move
//!   more than one, unpaced ones (cubic) cost more than one.
//!
//! Registration follows the provider's memory-registration mode: regions addressed by virtual
//! address or by offset, keys the provider or we pick (fresh random-started ones, unique in
//! the domain), and, where it asks for `FI_MR_LOCAL` (`verbs`, `efa`), registered local
//! buffers too: receives registered once, messages built in a pool of registered buffers,
//! the sources of writes and destinations of reads registered per operation.
//! `FI_MR_ENDPOINT` (memory bound to an endpoint, as `cxi` asks) is not supported: such a
//! provider is not offered by `fi_getinfo` for our hints.
//!
//! Failure closes the door to our memory. When the device reports an error (a peer lost or
//! failed, a transfer's own timeout) and when the communicator is marked failed (at its
//! engine's first failed operation) or dropped after a failure, it first reads the queue
//! and waits up to a second for our writes and reads still with the provider (libfabric
//! cancels none: a peer that is alive completes them, one that is gone fails them; data that
//! already arrived completes its transfer meanwhile), then withdraws the writes still queued
//! and closes every region our clear-to-send entries opened, to every peer. A peer that has
//! not heard of the failure yet cannot write into memory the application has taken back; a
//! write that landed before and is read only now is dropped quietly. A read whose waiter
//! gives up never starts if it was still queued. A peer caught breaking the protocol (a
//! malformed message, a write or an immediate nobody asked for, more writes than its
//! immediate names) is told so before it is cut off.

mod device;
mod fabric;
mod incoming;
mod op;
mod outgoing;
mod peer;
mod progress;
mod quiet;
mod setup;
mod shared;
mod state;
mod sys;
mod wire;

pub use device::{OfiDevice, WRITES_COMPLETE_MAX};
pub use setup::{
    FABRICS, RAILS, connect, fabrics_from_env, library, parse_wait, provider_from_env,
};
