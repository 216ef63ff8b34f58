//! Semantic checks after a complete run: every rank's output against what its operation
//! promises, in symbolic values (NCCL's count conventions, see [`crate::op`]).
//!
//! | kind | rank `r`'s output element `i` |
//! |---|---|
//! | AllReduce | input `i` of every rank (÷ world for Avg) |
//! | AllGather | input `i % count` of rank `i / count` |
//! | ReduceScatter | input `r * count + i` of every rank (÷ world for Avg) |
//! | Broadcast | input `i` of the root |
//! | Reduce | root: as AllReduce; others: user memory never written |
//! | AllToAll | input `r * count + i % count` of rank `i / count` |
//! | Recv | input `i` of the peer (`root`) |
//! | Send, Barrier | no output |
//!
//! Exact symbolic equality also rejects double counting (a rank's contribution twice), mixed
//! elements, a missing or repeated average, and uninitialised data.

use ampccl_runtime::ReduceOp;

use super::VerifyError;
use super::sim::Sim;
use super::value::Val;
use crate::op::{OpKind, OpParam};

/// What output element `i` of `p.rank` must hold; `None`: the output must stay untouched.
pub(crate) fn expected(p: &OpParam, i: usize) -> Option<Val> {
    let c = p.count;
    let all = if p.world >= 64 {
        u64::MAX
    } else {
        (1 << p.world) - 1
    };
    let avg = if p.op == ReduceOp::Avg && p.kind.reduces() {
        p.world as u32
    } else {
        0
    };
    match p.kind {
        OpKind::AllReduce => Some(Val::sum(all, i, avg)),
        OpKind::AllGather => Some(Val::input(i / c, i % c)),
        OpKind::ReduceScatter => Some(Val::sum(all, p.rank * c + i, avg)),
        OpKind::Broadcast | OpKind::Recv => Some(Val::input(p.root, i)),
        OpKind::Reduce => (p.rank == p.root).then(|| Val::sum(all, i, avg)),
        OpKind::AllToAll => Some(Val::input(i / c, p.rank * c + i % c)),
        OpKind::Send | OpKind::Barrier => None,
    }
}

/// Checks every rank that ran a job.
pub(crate) fn check(sim: &Sim, params: &[Option<OpParam>]) -> Result<(), VerifyError> {
    for (r, p) in params.iter().enumerate() {
        let (Some(p), Some(rank)) = (p, sim.ranks[r].as_ref()) else {
            continue;
        };
        let l = &rank.layout;
        let n = p.output_bytes() / l.elem;
        let (mem, base) = (l.mem[1], l.base[1] / l.elem);
        if n > 0 && expected(p, 0).is_none() {
            // Output that must not be touched (Reduce off the root).
            let user = |m: usize| m == l.mem[0] || m == l.mem[1];
            if let Some(a) = sim
                .accesses
                .iter()
                .find(|a| a.rank == r && a.write && a.end > a.start && user(a.mem))
            {
                return Err(VerifyError::WrongResult {
                    rank: r,
                    msg: format!(
                        "{}: the output of a non-root rank must stay untouched, but {} writes it",
                        p.describe(),
                        sim.access_desc(a)
                    ),
                });
            }
            continue;
        }
        let mut first = None;
        let mut wrong = 0;
        for i in 0..n {
            let want = expected(p, i).expect("an output is expected");
            let got = &rank.mems[mem][base + i];
            if *got != want {
                wrong += 1;
                first.get_or_insert_with(|| (i, got.clone(), want));
            }
        }
        if let Some((i, got, want)) = first {
            return Err(VerifyError::WrongResult {
                rank: r,
                msg: format!(
                    "{}: output element {i} is {got}, expected {want} ({wrong} of {n} elements wrong)",
                    p.describe()
                ),
            });
        }
    }
    Ok(())
}
