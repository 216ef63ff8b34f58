//! `BroadcastPair`: a broadcast between 2 ranks, copied by both of them at once.
//!
//! ```text
//! root:      offer(input[k..]) ── tx(input[..k] → peer's output) ── (copy input → output) ── done
//! receiver:  rx(output[..k]) ── read(root's input[k..] → output[k..]) ── done
//! ```
//! A chain ([`super::broadcast_chain`]) on 2 ranks has one copier at a time per byte: the root
//! writes, the receiver waits (or copies each chunk out of its window, a second copy). Here the
//! root writes the first half straight into the receiver's output while the receiver reads the
//! second half straight out of the root's input (a read offer, see
//! `ampccl_transport::protocol`): one copy per byte, both cores copying. Needs links that reach
//! user memory (cross-memory attach); the operator picks it on 2 ranks from [`MIN_BYTES`] while
//! the message fits a share of the cache ([`CACHE_SHARE`]).
//!
//! Both ranks must cut the message alike, so the cut depends on the size alone: the receiver
//! does not know whether the root's call is in place. Out of place the root also copies its
//! input to its output, so it works 1.5 halves to the receiver's one; a smaller root part
//! would suit that case and not the in-place one (`MPI_Bcast`, `torch.distributed.broadcast`).
//! 2 ranks, out of place / in place µs, two runs (`ampccl-perf -g 2 -o broadcast -b 256K -e
//! 64M -f 4 -n 50 -w 10`), root part 0.4 / 0.5 / 0.6 of the message: 1 MiB 74.5/29.6–31.7,
//! 83.8–87.3/26.7–28.5, 94.1–96.5/30.2–33.4; 16 MiB 1699–1785/971–997, 1891–1901/838–840,
//! 2042–2048/992–999 µs.

use ampccl_runtime::{Error, Result};

use crate::executor::Executor;
use crate::op::OpParam;
use crate::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use crate::steps::pipe::copy_through;

/// Smallest message the operator hands to this algorithm (2 ranks, links reaching user
/// memory). In place, µs, 3 alternated runs (`ampccl-perf -g 2 -o broadcast -b 16K -e 256K -f 2
/// -n 500 -w 50`), pair vs chain: 16 KiB 2.37–2.67 vs 2.66–3.55, 32 KiB 3.13–3.35 vs
/// 3.66–5.35, 64 KiB 4.02–4.39 vs 5.38–7.87, 256 KiB 8.22–8.82 vs 13.29–13.52; out of place
/// the pair wins from 32 KiB (4.05–4.19 vs 4.19–5.18), ties at 16 KiB.
pub const MIN_BYTES: usize = 32 * 1024;

/// The operator hands a message to this algorithm while it takes at most this fraction
/// (1/`CACHE_SHARE`) of the host's last-level cache: the root's input and the receiver's
/// output then stay cached together. Beyond it the cross-memory copies, plain stores that
/// first read each line they overwrite, lose to the chain, whose receiver streams each chunk
/// out of its window. In place, µs, 5 alternated runs (session 7, AMD EPYC, 32 MiB L3:
/// `AMPCCL_ALGO_BROADCAST=... ampccl-perf -g 2 -o broadcast -b 4M -e 16M -f 2 -n 40 -w 5`,
/// and `-b 1M -e 64M -f 4 -n 30 -w 5`, 3 runs), pair vs chain: 4 MiB 163 vs 447, 8 MiB 369 vs
/// 555, 16 MiB 1152 vs 873, 64 MiB 6211 vs 4534; out of place about a tie from 16 MiB (1916
/// vs 1967, 10032 vs 10172). On the Intel Xeon of session 6 (260 MiB L3 reported) the pair
/// still won at 64 MiB.
pub const CACHE_SHARE: usize = 4;

pub struct BroadcastPair;

/// Bytes the root writes (the receiver reads the rest): half the message, whole elements.
fn root_bytes(p: &OpParam, bytes: usize) -> usize {
    bytes / 2 / p.elem() * p.elem()
}

impl Executor for BroadcastPair {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        AlgResourceRequest::ring(p.rank, p.world)
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let bytes = p.count * p.elem();
        if p.world == 1 {
            return copy_through(p, res, bytes);
        }
        let peer = p.pair_peer("BroadcastPair")?;
        if !res.user_mem_links {
            return Err(Error::InvalidArgument(
                "BroadcastPair needs links that reach user memory (cross-memory attach)".into(),
            ));
        }
        let k = root_bytes(p, bytes);
        if p.rank == p.root {
            let input = Mem::of(BufKind::UserIn);
            res.tasks.offer_async(MAIN, peer, input.add(k), bytes - k)?;
            if k > 0 {
                res.tasks.tx_async(MAIN, peer, input, k)?;
            }
            copy_through(p, res, bytes)?;
            if k > 0 {
                res.tasks.tx_wait_done(MAIN, peer)?;
            }
            res.tasks.offer_wait_done(MAIN, peer, bytes - k)
        } else {
            let output = Mem::of(BufKind::UserOut);
            if k > 0 {
                res.tasks.rx_async(MAIN, peer, output, k)?;
            }
            res.tasks.read_async(MAIN, peer, output.add(k), bytes - k)?;
            if k > 0 {
                res.tasks.rx_wait_done(MAIN, peer, k)?;
            }
            res.tasks.tx_wait_done(MAIN, peer)
        }
    }
}
