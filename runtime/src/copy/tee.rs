//! One source copied to two destinations in one pass (an operation's own output and memory a
//! peer reads): each block is read once from its source and written to both, each destination
//! stored for its reader.

use super::{CopyTo, STREAM_MIN, STREAM_OUT_MIN, SharedCopy, copy_unfenced, fence};
use crate::param::{Param, Unit};

/// Bytes of the blocks in which [`tee`] copies: a block goes to the first destination, then,
/// read again from the L1 cache, to the second.
pub static TEE_BLOCK: Param = Param::new(
    "TEE_BLOCK",
    8 << 10,
    (64, 1 << 20),
    Unit::Bytes,
    "block size of one-pass double copies (fits the L1 cache)",
);

/// The store choice of tees that write for a peer (their time covers two destinations, so
/// they keep their own costs).
static TEE_TO_PEER: std::sync::LazyLock<SharedCopy> = std::sync::LazyLock::new(SharedCopy::default);

/// Copies `len` bytes from `src` to both destinations, each stored for who reads it next as
/// [`super::copy`], [`super::copy_out`] and [`super::copy_to_peer`] store it ([`CopyTo`]), reading the source
/// once: block by block ([`TEE_BLOCK`]), the second copy of a block reads it from the L1 cache.
/// Two separate copies of a cache-resident source would read it twice from the L2 or L3 cache.
///
/// # Safety
/// As [`super::copy`] for each destination; the two destinations are disjoint.
pub unsafe fn tee(dsts: [(*mut u8, CopyTo); 2], src: *const u8, len: usize) {
    with_tee_choice(dsts.map(|(_, to)| to), len, |stream| {
        let mut off = 0;
        while off < len {
            let n = TEE_BLOCK.bytes().min(len - off);
            for ((dst, _), stream) in dsts.iter().zip(stream) {
                // SAFETY: `off + n <= len`: inside the caller's ranges.
                unsafe { copy_unfenced(dst.add(off), src.add(off), n, stream) };
            }
            off += n;
        }
    });
}

/// Runs `write` of `len` bytes to destinations stored for `tos`, passing whether each one
/// streams (as [`super::copy_to`] decides; for [`CopyTo::Peer`] by the store choice of tees), and
/// fences after it where one streamed. `write` copies with [`copy_unfenced`].
pub(crate) fn with_tee_choice<const N: usize>(
    tos: [CopyTo; N],
    len: usize,
    write: impl FnOnce([bool; N]),
) {
    let run = |peer_streams: bool| {
        let stream = tos.map(|to| match to {
            CopyTo::Local => len >= STREAM_MIN.bytes(),
            CopyTo::Output => len >= STREAM_OUT_MIN.bytes(),
            CopyTo::Peer => peer_streams,
        });
        write(stream);
        if stream.contains(&true) {
            fence();
        }
    };
    if tos.contains(&CopyTo::Peer) {
        TEE_TO_PEER.stores.run(len, run);
    } else {
        run(false);
    }
}
