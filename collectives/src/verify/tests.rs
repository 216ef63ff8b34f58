//! The verifier over every registered algorithm: world sizes 2..=8, counts 0, 1, 7, 1021 and
//! one past the CCL buffer (chunking), f32 and u8, Sum and Avg (reducing kinds), in and out of
//! place, with and without user-memory links, roots 0 and world-1 (Send/Recv: the pair
//! 0 -> world-1 and back).
//!
//! Applicability rule: every entry runs on every configuration (`AMPCCL_ALGO_*` can force any
//! algorithm), except that a configuration the operator would *not* select the entry for is
//! skipped when verification fails only because the executor needs more CCL buffer than it
//! has ([`VerifyError::exceeds_ccl`], e.g. `AllReduceOneShot` needs `count * elem * world`) or
//! refuses it as outside its domain ([`VerifyError::not_applicable`], e.g. `AllReducePair`
//! off 2 ranks).
//! A configuration the operator selects must always pass; one its `validate` refuses (in-place
//! AllToAll on several ranks) is not generated.

use crate::algorithms::{
    allgather_pair, allgather_ring, allreduce_oneshot, allreduce_pair, allreduce_ring,
    broadcast_chain, broadcast_pair,
};
use ampccl_runtime::{DataType, ReduceOp};

use super::*;

/// Small CCL buffers force chunking.
const CCL: usize = 4096;

fn counts(elem: usize) -> [usize; 5] {
    [0, 1, 7, 1021, 3 * CCL / elem + 5]
}

/// The parameter matrix for `kind` on `world` ranks.
fn params(kind: OpKind, world: usize) -> Vec<OpParam> {
    let mut v = Vec::new();
    let ops: &[ReduceOp] = if kind.reduces() {
        &[ReduceOp::Sum, ReduceOp::Avg]
    } else {
        &[ReduceOp::Sum]
    };
    // (rank, root): rank matters only for Send (the sender) and Recv (the receiver).
    let roots: Vec<(usize, usize)> = match kind {
        OpKind::Send | OpKind::Recv => vec![(0, world - 1), (world - 1, 0)],
        k if k.has_root() => vec![(0, 0), (0, world - 1)],
        _ => vec![(0, 0)],
    };
    let in_place: &[bool] = match kind {
        OpKind::Send | OpKind::Recv | OpKind::Barrier => &[false],
        _ => &[false, true],
    };
    for dtype in [DataType::F32, DataType::U8] {
        let cs: Vec<usize> = if kind == OpKind::Barrier {
            vec![0]
        } else {
            counts(dtype.size()).to_vec()
        };
        for count in cs {
            for &op in ops {
                for &(rank, root) in &roots {
                    for &in_place in in_place {
                        let p = OpParam {
                            kind,
                            count,
                            dtype,
                            op,
                            root,
                            rank,
                            world,
                            in_place: in_place && count > 0,
                            seq: 0,
                        };
                        // Calls the operator refuses never reach an executor.
                        if crate::operator::for_kind(kind).validate(&p).is_ok() {
                            v.push(p);
                        }
                    }
                }
            }
        }
    }
    v
}

/// `(user_mem_links, shared_ranks, ranks_per_host)` of every verification: one host with links
/// into any user memory or not, user buffers in shared memory on every rank or on rank 0 only
/// (each rank decides from its own buffers); and hosts of one and of two ranks, linked by a
/// network provider (which receives into any memory).
const SETUPS: [(bool, u64, usize); 6] = [
    (false, 0, usize::MAX),
    (true, 0, usize::MAX),
    (false, u64::MAX, usize::MAX),
    (false, 1, usize::MAX),
    (true, 0, 1),
    (true, 0, 2),
];

/// Verifies every entry of `kind`; returns `(name, passed, skipped)` per entry.
fn verify_kind(kind: OpKind) -> Vec<(&'static str, usize, usize)> {
    let reg = Registry::builtin();
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for entry in reg.list().filter(|e| e.kind == kind) {
        let (mut passed, mut skipped) = (0, 0);
        for world in 2..=8 {
            for p in params(kind, world) {
                for (user_mem_links, shared_ranks, ranks_per_host) in SETUPS {
                    // Receive slots from wherever earlier calls left the cursor.
                    let cfg = VerifyConfig {
                        ccl_size: CCL,
                        user_mem_links,
                        shared_ranks,
                        fifo_depth: 256,
                        window_cursor: (p.count * 24 + world * 8) % CCL,
                        ranks_per_host,
                    };
                    match verify_entry(&reg, entry, &p, &cfg) {
                        Ok(_) => passed += 1,
                        Err(e)
                            if !selected(entry, &p, &cfg)
                                && (e.exceeds_ccl() || e.not_applicable()) =>
                        {
                            skipped += 1
                        }
                        Err(e) => failures.push(format!(
                            "{} on {} (world {world}, rank {}, in_place {}, uml {user_mem_links}, shared {shared_ranks:#x}, ranks per host {ranks_per_host}): {e}",
                            entry.name,
                            p.describe(),
                            p.rank,
                            p.in_place
                        )),
                    }
                }
            }
        }
        out.push((entry.name, passed, skipped));
    }
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    out
}

/// `(passed, skipped)` of algorithm `name` in a [`verify_kind`] result.
fn outcome(r: &[(&'static str, usize, usize)], name: &str) -> (usize, usize) {
    let &(_, ok, skip) = r.iter().find(|x| x.0 == name).expect("registered");
    (ok, skip)
}

/// `name` ran every configuration and refused none.
fn assert_runs_everywhere(r: &[(&'static str, usize, usize)], name: &str) {
    let (ok, skip) = outcome(r, name);
    assert!(ok > 0 && skip == 0, "{name}: {r:?}");
}

/// `name`, a 2-rank algorithm, ran some configurations and refused more.
fn assert_refuses_most(r: &[(&'static str, usize, usize)], name: &str) {
    let (ok, skip) = outcome(r, name);
    assert!(ok > 0 && skip > ok, "{name}: {r:?}");
}

#[test]
fn all_reduce_algorithms() {
    let r = verify_kind(OpKind::AllReduce);
    assert_runs_everywhere(&r, allreduce_ring::NAME);
    let (one_ok, one_skip) = outcome(&r, allreduce_oneshot::NAME);
    assert!(one_ok > 0 && one_skip > 0, "{r:?}");
    // The pair runs every 2-rank configuration and refuses the rest.
    assert_refuses_most(&r, allreduce_pair::NAME);
}

#[test]
fn all_gather_algorithms() {
    let r = verify_kind(OpKind::AllGather);
    assert_runs_everywhere(&r, allgather_ring::NAME);
    // The pair runs every 2-rank configuration, with and without user-memory links, and
    // refuses the rest.
    assert_refuses_most(&r, allgather_pair::NAME);
}

#[test]
fn reduce_scatter_algorithms() {
    verify_kind(OpKind::ReduceScatter);
}

#[test]
fn broadcast_algorithms() {
    let r = verify_kind(OpKind::Broadcast);
    assert_runs_everywhere(&r, broadcast_chain::NAME);
    assert_refuses_most(&r, broadcast_pair::NAME);
}

#[test]
fn reduce_algorithms() {
    verify_kind(OpKind::Reduce);
}

#[test]
fn all_to_all_algorithms() {
    verify_kind(OpKind::AllToAll);
}

#[test]
fn send_recv_algorithms() {
    verify_kind(OpKind::Send);
    verify_kind(OpKind::Recv);
}

#[test]
fn barrier_algorithms() {
    verify_kind(OpKind::Barrier);
}

#[test]
fn operator_selection_is_verified() {
    let reg = Registry::builtin();
    for world in 2..=8 {
        for p in params(OpKind::AllReduce, world) {
            let cfg = VerifyConfig {
                ccl_size: CCL,
                ..Default::default()
            };
            let (name, report) = verify_registry(&reg, &p, &cfg).unwrap();
            assert_eq!(name, selection(&p, &cfg));
            assert_eq!(report.world, world);
            if p.count > 0 {
                assert!(
                    report.transfers > 0 && report.bytes_moved > 0,
                    "{name} {report:?}"
                );
            }
        }
    }
}

/// One-shot's receive slots rotate only where the window holds one per rank (slots lie whole
/// cache lines apart): a CCL buffer that fits the inputs but not as many whole-line slots
/// (4 ranks × 8196 bytes in 32784) takes fixed offsets, from any cursor.
#[test]
fn one_shot_fits_a_buffer_of_exactly_its_inputs() {
    let rotate_min = crate::algorithms::allreduce_oneshot::ROTATE_MIN.bytes();
    let reg = Registry::builtin();
    let entry = reg
        .list()
        .find(|e| e.name == allreduce_oneshot::NAME)
        .unwrap();
    for in_place in [false, true] {
        let p = OpParam {
            kind: OpKind::AllReduce,
            count: rotate_min / 4 + 1,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
            rank: 0,
            world: 4,
            in_place,
            seq: 0,
        };
        for window_cursor in [0, 64, 20000] {
            let cfg = VerifyConfig {
                ccl_size: 4 * (rotate_min + 4),
                window_cursor,
                ..Default::default()
            };
            verify_entry(&reg, entry, &p, &cfg).unwrap();
        }
    }
}
