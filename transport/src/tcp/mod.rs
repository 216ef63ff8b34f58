//! The TCP provider: the RMA device interface ([`crate::device::RmaDevice`]) over one TCP
//! connection per pair of ranks, so the receiver-driven protocol ([`crate::protocol`]) runs
//! unchanged between hosts.
//!
//! Every one-sided operation becomes a frame ([`frame`]) on the connection to the peer it
//! targets: a clear-to-send entry, a write (header, then the payload, received straight into
//! the memory the clear-to-send named), a write-with-immediate (ordered after the writes it
//! completes, because one connection delivers in order), an eager message, a credit, an ack, a
//! read request and its response. What a frame delivers lands in the receiver's per-peer state
//! ([`peer`]), the mirror of the shared-memory provider's segment, which the protocol polls with
//! plain loads. Frames are applied by the engine itself while it polls (complete small frames
//! already in the socket) and otherwise by a receiving thread per connection that blocks in
//! `poll` and rings the engine's doorbell ([`reader`]). A sender writes its frames from the
//! engine's thread, whole, under the connection's lock.
//!
//! Memory a peer may write is only ever what a posted clear-to-send named: the key of each
//! entry is its FIFO slot, the receiving side keeps the slot's bounds until the transfer's
//! immediate arrives, and a write or read outside them ends the connection as a protocol
//! violation. So the provider accepts any local memory (`exposes_user_memory`): receives land
//! in user buffers without a bounce.
//!
//! With `AMPCCL_NSOCKS` > 1, each pair of ranks holds several connections and large writes are
//! striped over them ([`stripe`]).
//!
//! Connections are set up through the bootstrap ([`connect`]): each rank listens on the
//! address its bootstrap listens on, the lower rank of each pair connects, and a hello with a
//! secret the ranks share through the bootstrap (drawn by rank 0) keeps strangers out; hellos
//! are read from every pending connection at once, each with its own deadline, so silent
//! connections cost nothing but their slot.

mod device;
mod frame;
mod peer;
mod reader;
pub mod stripe;
#[cfg(feature = "io-uring")]
mod uring;

pub use device::{TcpDevice, connect, connect_to};
pub use reader::POLLED_LOWAT;
