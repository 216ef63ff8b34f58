//! Chunked point-to-point exchange: send a block to one peer while receiving a block of the
//! same size from another (or the same) peer, on one stream.
//!
//! The received data either lands straight in its destination (when links can write user
//! memory, `AlgResourceResponse::user_mem_links`) or goes through a bounce slot of a CCL buffer
//! and is copied out; then the transfer is cut into chunks of the slot's size. Each chunk posts
//! its receive before its send (mismatches are detected instead of deadlocking), and the slot
//! is re-posted only after the copy that consumed it (same stream, so stream order guarantees
//! it). Used by the mesh allgather (one stream per peer, a slot each) and the pairwise
//! all-to-all.

use ampccl_runtime::Result;

use crate::resource::{AlgResourceResponse, BufKind, MAIN, Mem, StreamId};
use crate::steps::blocks::rounds;

/// Where received data goes on its way to its destination.
#[derive(Clone, Copy, Debug)]
pub enum Landing {
    /// Straight into the destination (the link writes user memory).
    Direct,
    /// Through `bytes` (a whole number of elements, non-zero) of a CCL buffer at `slot`.
    Bounce { slot: Mem, bytes: usize },
}

impl Landing {
    /// `Direct` when `res` links receive into user memory, otherwise a bounce slot of
    /// `slot_bytes` at `slot`.
    pub fn for_links(res: &AlgResourceResponse<'_>, slot: Mem, slot_bytes: usize) -> Landing {
        if res.user_mem_links {
            Landing::Direct
        } else {
            Landing::Bounce {
                slot,
                bytes: slot_bytes,
            }
        }
    }
}

/// On stream `s`: sends `bytes` at `src` to rank `to` and receives `bytes` from rank `from`
/// into `dst`, chunked as `landing` requires. Both peers must exchange the same byte count and
/// use the same chunking (it depends on the CCL buffer size and the link kind only).
#[allow(clippy::too_many_arguments)]
pub fn exchange(
    res: &mut AlgResourceResponse<'_>,
    s: StreamId,
    to: usize,
    src: Mem,
    from: usize,
    dst: Mem,
    bytes: usize,
    landing: Landing,
) -> Result<()> {
    let chunk = match landing {
        Landing::Direct => bytes,
        Landing::Bounce { bytes: b, .. } => b,
    };
    for (off, len) in rounds(bytes, chunk) {
        let target = match landing {
            Landing::Direct => dst.add(off),
            Landing::Bounce { slot, .. } => slot,
        };
        res.tasks.rx_async(s, from, target, len)?;
        res.tasks.tx_async(s, to, src.add(off), len)?;
        res.tasks.rx_wait_done(s, from, len)?;
        if let Landing::Bounce { slot, .. } = landing {
            res.tasks.copy(s, dst.add(off), slot, len)?;
        }
        res.tasks.tx_wait_done(s, to)?;
    }
    Ok(())
}

/// Copies `bytes` of the user input at byte offset `src_off` to the user output at `dst_off`
/// on the main stream, unless the operation is in place (the data is already there).
pub fn copy_own(
    res: &mut AlgResourceResponse<'_>,
    in_place: bool,
    dst_off: usize,
    src_off: usize,
    bytes: usize,
) -> Result<()> {
    if in_place || bytes == 0 {
        return Ok(());
    }
    res.tasks.copy(
        MAIN,
        Mem::of(BufKind::UserOut).add(dst_off),
        Mem::of(BufKind::UserIn).add(src_off),
        bytes,
    )
}
