//! The `ofi` provider: the RMA device interface ([`crate::device::RmaDevice`]) on libfabric's
//! reliable-datagram endpoints with RMA, the interface through which MPI implementations and
//! NCCL's AWS plugin reach InfiniBand, RoCE and EFA (libfabric's `verbs` and `efa` providers),
//! and which its `tcp;ofi_rxm`, `tcp` and `shm` providers offer over sockets and shared memory.
//!
//! libfabric is loaded at run time ([`sys`]): without it the provider reports no device. Rank 0
//! picks the libfabric provider (`AMPCCL_OFI_PROVIDER`, else the first with reliable datagrams,
//! RMA and at least 4 bytes of remote completion data), every rank opens an
//! endpoint of it ([`fabric`]) and the ranks swap endpoint addresses through the bootstrap.
//!
//! The receiver-driven protocol maps onto it as on an RDMA NIC:
//! - a clear-to-send registers the memory it names (`fi_mr_reg`, with a fresh random
//!   application key or the provider's key, for remote writes, or reads for a read offer) and
//!   travels as a small message ([`wire`]) carrying the key; the entry's key becomes its FIFO
//!   slot, under which the sender finds the memory key and the region's bounds;
//! - data goes as `fi_writedata` into that region, each write carrying 32 bits of remote
//!   completion data (the writer's rank and the slot), so the receiver counts the writes that
//!   landed;
//! - the immediate travels as a message naming how many writes it completes: the receive
//!   completes once both are in, whatever order the provider delivered them in, and the
//!   region's registration closes;
//! - eager messages, credits, acks and failure notes are messages into receives posted for
//!   any sender; each message names its sender's rank (a message naming no peer is dropped).
//!
//! All libfabric calls happen under one lock ([`state`]). Every poll of the device reads the
//! completion queue, which drives the provider: libfabric 1.17's `tcp;ofi_rxm` and `shm` make
//! progress only inside such calls, also for writes that target us. Between polls a progress
//! thread blocks on the queue's wait descriptor (`fi_trywait`, then `poll`), reads what comes
//! and rings the engine's doorbell, so neither side burns a core while waiting. The same
//! thread sends each peer a liveness message every 300 ms: a send to a dead peer fails, and
//! the peer's waiters get an error naming it.

mod device;
mod fabric;
mod state;
mod sys;
mod wire;

pub use device::{
    FABRICS, OfiDevice, RAILS, connect, fabrics_from_env, library, provider_from_env,
};
