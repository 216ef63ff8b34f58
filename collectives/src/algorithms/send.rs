//! `Send`: the sending half of a point-to-point transfer (HCCL's chunked loop through the CCL buffer).
//!
//! The message goes in chunks of half the CCL input buffer — the receiver's slots, so both
//! sides derive the same chunking from the byte count and the buffer size (see
//! [`crate::algorithms::recv`]). For each chunk: write it from the user's input into the
//! receive the peer posted (a rendezvous write waits for the peer's clear-to-send, which it
//! posts only once the slot is free; an eager one lands in the link's eager slot, which the
//! peer's credits keep free), complete the write. No buffer-free ack precedes a chunk (HCCL's
//! `TxAck`/`RxAck`): the receiver-driven protocol already holds a chunk back until the peer
//! is ready, and the ack's round trip tripled a small message's time across hosts. A message
//! of zero bytes is still one empty transfer, so a 0-vs-N mismatch fails on both sides
//! instead of passing silently. Runs the head of [`crate::steps::pipe::relay`].
//!
//! Links to every peer are requested: the resources are cached per algorithm, not per peer.

use ampccl_runtime::{Error, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse};
use crate::steps::pipe::{self, ChunkBound, Deliver, Pipe};

/// The registry name of [`Send`] (`AMPCCL_ALGO_<OP>` values, operators' selections).
pub const NAME: &str = "Send";

pub struct Send;

/// The chunk geometry both halves of a transfer use: bytes, not elements (Send and Recv only
/// agree on the byte count).
pub(crate) fn p2p_bound(ccl_in_size: usize) -> ChunkBound {
    ChunkBound::new(ccl_in_size, 1)
}

/// A transfer with this rank itself cannot go over a link (the framework pairs it in a group).
pub(crate) fn check_peer(p: &OpParam) -> Result<()> {
    if p.root == p.rank || p.root >= p.world {
        return Err(Error::InvalidArgument(format!(
            "{}: peer {} needs a group with the matching send/recv (world {})",
            p.describe(),
            p.root,
            p.world
        )));
    }
    Ok(())
}

impl Executor for Send {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::mesh(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        check_peer(p)?;
        let bound = p2p_bound(res.ccl_in_size);
        let pipe = Pipe {
            from: None,
            to: Some(p.root),
            bound,
        };
        let mut stage = Deliver {
            head: true,
            keep: false,
            direct: false,
        };
        pipe::relay(
            res,
            &pipe,
            &bound.chunks(p.count * p.elem(), true),
            &mut stage,
        )
    }
}
