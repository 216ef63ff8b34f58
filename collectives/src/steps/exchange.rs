//! Chunked point-to-point exchange: send a block to one peer while receiving a block of the
//! same size from another (or the same) peer, on one stream.
//!
//! The received data either lands straight in its destination (where links can write user
//! memory, `AlgResourceResponse::user_mem_links`, and the algorithm chooses to) or goes
//! through the slots of a [`Window`] of the CCL input buffer and is copied out; then the
//! transfer is cut into chunks of the slot's size. Each chunk posts its receive before its
//! send (mismatches are detected instead of deadlocking), and is copied out before the next
//! chunk's receive is posted (same stream, so stream order guarantees it). Used by the mesh
//! allgather (one stream per peer, a part of the buffer each) and the pairwise all-to-all.

use ampccl_runtime::{Error, Result};

use crate::op::OpParam;
use crate::resource::{AlgResourceResponse, BufKind, MAIN, Mem, StreamId};
use crate::steps::blocks::rounds;
use crate::steps::window::Window;

/// Where received data goes on its way to its destination.
#[derive(Clone, Copy, Debug)]
pub enum Landing<'a> {
    /// Straight into the destination (the link writes user memory).
    Direct,
    /// Through the slots of `window`, `bytes` (whole elements, non-zero) at a time.
    Bounce { window: Window<'a>, bytes: usize },
}

impl<'a> Landing<'a> {
    /// Through part `part` of `parts` of the CCL input buffer, in slots of `bytes` or the most
    /// the part holds. An error when not even one element of `p`'s type fits.
    pub fn window(
        p: &OpParam,
        res: &AlgResourceResponse<'a>,
        part: usize,
        parts: usize,
        bytes: usize,
    ) -> Result<Landing<'a>> {
        let bytes = bytes.min(Window::max_slot(res, parts, p.elem()));
        if bytes == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: a CCL buffer of {} bytes has no room for two {} in each of {parts} parts",
                p.kind.name(),
                res.ccl_in_size,
                p.dtype.name()
            )));
        }
        Ok(Landing::Bounce {
            window: Window::part(res, part, parts, bytes),
            bytes,
        })
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
    landing: Landing<'_>,
) -> Result<()> {
    let chunk = match landing {
        Landing::Direct => bytes,
        Landing::Bounce { bytes: b, .. } => b,
    };
    for (k, (off, len)) in rounds(bytes, chunk).enumerate() {
        let target = match landing {
            Landing::Direct => dst.add(off),
            Landing::Bounce { window, .. } => window.slot(k),
        };
        res.tasks.rx_async(s, from, target, len)?;
        res.tasks.tx_async(s, to, src.add(off), len)?;
        res.tasks.rx_wait_done(s, from, len)?;
        if matches!(landing, Landing::Bounce { .. }) {
            res.tasks.copy(s, dst.add(off), target, len)?;
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
