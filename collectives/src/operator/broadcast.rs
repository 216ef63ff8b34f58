//! Broadcast operator: on 2 ranks the pair, in which root and receiver share the copying
//! ([`crate::algorithms::broadcast_pair`]); otherwise the pipelined chain from the root (why the
//! chain beats the alternatives there: [`crate::algorithms::broadcast_chain`]).
//!
//! The pair is chosen whether or not the buffers are shared user memory (each rank knows only
//! its own, and both must run the same algorithm). Against the chain, with ordinary buffers, 5
//! clean alternated pairs, µs out of place / in place (session 14; `PERF_A=x PERF_B=x python3
//! benches/scripts/ab_probed.py 5 X=1 AMPCCL_TMP_BP=1 -o broadcast -b 32K -e 16M -f 2 -n 200 -w
//! 50`, the choice set by a temporary variable), chain vs pair: 32 KiB 4.6/4.6 vs 2.2/2.1,
//! 256 KiB 12.3/9.8 vs 11.5/7.4, 1 MiB 56.2/34.5 vs 59.1/34.5, 4 MiB 214/130 vs 239/133,
//! 16 MiB 1867/723 vs 1875/793; in slow spells of the host alike. With both ranks' buffers
//! shared the pair takes 4 MiB in 57 µs in place (docs/PERFORMANCE.md, "Session 14"). With the
//! pair's 512 KiB chunks (session 15; `ab_probed.py 5 AMPCCL_ALGO_BROADCAST=BroadcastChain X=1
//! -o broadcast -b 256K -e 32M -f 2 -n 40 -w 10`, 5 clean pairs), chain vs pair: 1 MiB
//! 56.0/34.9 vs 50.9/29.8, 4 MiB 227/130 vs 239/117, 8 MiB 650/260 vs 692/268, 16 MiB
//! 1897/809 vs 2060/836: the pair wins in place up to 4 MiB and ties beyond; out of place the
//! chain wins from 4 MiB (the pair's root copies into its output besides). Since the root
//! stages each pull chunk and copies it into its output in one pass (a tee, session 16; `PERF_A=x
//! PERF_B=x ab_probed.py 8 AMPCCL_ALGO_BROADCAST=BroadcastChain X=1 -o broadcast -b 1M -e 32M -f
//! 2 -n 40 -w 10`, 6 clean pairs), chain vs pair: 1 MiB 55.9/33.8 vs 44.2/29.5, 4 MiB
//! 243/132 vs 222/119, 8 MiB 791/279 vs 682/299, 16 MiB 2721/1039 vs 2340/986, 32 MiB
//! 5318/2846 vs 4851/2919: the pair also wins out of place.

use crate::executor::{Operator, SelectCtx};
use crate::op::OpParam;

pub struct BroadcastOperator;

impl Operator for BroadcastOperator {
    fn select_alg(&self, p: &OpParam, _ctx: &SelectCtx) -> (&'static str, u64) {
        if p.world == 2 {
            ("BroadcastPair", 0)
        } else {
            ("BroadcastChain", 0)
        }
    }
}
