//! Correctness of every collective across processes: each collective × every dtype × every
//! reduce op (reducing collectives) × counts × in place / out of place, against a reference
//! each rank computes locally (see `ampccl_tests::data`). One test per collective and world
//! size; the big count runs for `f32` and `u8` with `Sum` only, to bound the time on 2 cores.

use std::ops::DerefMut;
use std::time::{SystemTime, UNIX_EPOCH};

use ampccl::{Communicator, ReduceOp, SharedBuf};
use ampccl_tests::data::{TestElem, check, input, mix, reduced};
use ampccl_tests::ofi::{self, Libfabric};
use ampccl_tests::{
    Hosts, Launch, Outcome, each_dtype, ensure, err, init_comm, launch, threads_named, worker,
};

/// Counts every dtype and op runs: 0, 1 and primes, none divisible by the world sizes. 4099
/// elements take each transport's eager path for the smaller types and its rendezvous for the
/// larger ones (8-byte: 32 792 bytes, just past `ofi`'s 32 KiB eager size).
const SMALL: [usize; 5] = [0, 1, 7, 1021, 4099];
/// The big count (`f32` and `u8`, `Sum` only).
const BIG: usize = (1 << 20) + 3;

#[test]
fn worker_entry() {
    worker(|scenario| {
        let comm = init_comm()?;
        let c = &comm;
        match scenario {
            "allreduce" => each_dtype!(allreduce(c, false)),
            "allreduce_mixed" => each_dtype!(allreduce(c, true)),
            "allgather" => each_dtype!(allgather(c)),
            "reduce_scatter" => each_dtype!(reduce_scatter(c)),
            "broadcast" => each_dtype!(broadcast(c)),
            "reduce" => each_dtype!(reduce(c)),
            "all_to_all" => each_dtype!(all_to_all(c)),
            "sendrecv" => each_dtype!(sendrecv(c)),
            "eager_edges" => eager_edges(c)?,
            "last_words" => last_words(c)?,
            "barrier" => barrier(c)?,
            "topology" => topology(c)?,
            "transport" => transport(c)?,
            s => return Err(format!("unknown scenario {s:?}")),
        }
        comm.destroy().map_err(err("destroy"))?;
        // The `ofi` device stops and joins its progress thread when it drops, so that the
        // endpoint never closes on that thread while the process exits.
        let left = threads_named("ampccl-ofi-prog");
        ensure(left.is_empty(), || {
            format!("{} ofi progress thread(s) outlived destroy", left.len())
        })
    });
}

/// The `(count, op)` cases of `T` for a collective (`reduces`: every op, else `Sum` only).
fn cases<T: TestElem>(reduces: bool) -> Vec<(usize, ReduceOp)> {
    let ops: &[ReduceOp] = if reduces {
        &ReduceOp::ALL
    } else {
        &[ReduceOp::Sum]
    };
    let mut v: Vec<(usize, ReduceOp)> = SMALL
        .iter()
        .flat_map(|&n| ops.iter().map(move |&op| (n, op)))
        .collect();
    if matches!(T::NAME, "f32" | "u8") {
        v.push((BIG, ReduceOp::Sum));
    }
    v
}

/// Separates the data of different cases (stale data from an earlier case cannot pass).
fn salt(kind: u64, count: usize, in_place: bool, root: usize) -> u64 {
    mix(kind, count as u64, ((root as u64) << 1) | in_place as u64)
}

fn what<T: TestElem>(
    c: &Communicator,
    name: &str,
    op: ReduceOp,
    count: usize,
    in_place: bool,
) -> String {
    format!(
        "{name} {} {op:?} count {count} {} on rank {}/{}",
        T::NAME,
        if in_place { "in place" } else { "out of place" },
        c.rank(),
        c.world()
    )
}

/// Environment variable: `all` puts the buffers of the allreduce, allgather and broadcast cases
/// in shared user memory ([`SharedBuf`]) on every rank, `odd` on odd ranks only.
const SHARED_VAR: &str = "AMPCCL_TEST_SHARED";

/// `v`, moved into shared user memory where [`SHARED_VAR`] asks for it on this rank.
fn place<T: TestElem>(c: &Communicator, v: Vec<T>) -> Box<dyn DerefMut<Target = [T]>> {
    let shared = match std::env::var(SHARED_VAR).as_deref() {
        Ok("all") => true,
        Ok("odd") => c.rank() % 2 == 1,
        _ => false,
    };
    if shared {
        Box::new(SharedBuf::from_fn(v.len(), |i| v[i]).expect("shared allocation"))
    } else {
        Box::new(v)
    }
}

/// `mixed`: odd ranks run each case in the other placement (NCCL lets ranks differ).
fn allreduce<T: TestElem>(c: &Communicator, mixed: bool) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    for (n, op) in cases::<T>(true) {
        for case_in_place in [false, true] {
            let s = salt(1, n, case_in_place, 0);
            let in_place = case_in_place ^ (mixed && rank % 2 == 1);
            let w = what::<T>(c, "allreduce", op, n, in_place);
            let want = reduced::<T>(world, n, op, s);
            let mine = place(c, input::<T>(rank, n, op, s));
            if in_place {
                let mut buf = mine;
                c.all_reduce_in_place(&mut buf, op).map_err(err(&w))?;
                check(&w, op, &buf, &want)?;
            } else {
                let mut recv = place(c, vec![T::poison(); n]);
                c.all_reduce(&mine, &mut recv, op).map_err(err(&w))?;
                check(&w, op, &recv, &want)?;
                check(
                    &format!("{w} (send unchanged)"),
                    op,
                    &mine,
                    &input(rank, n, op, s),
                )?;
            }
        }
    }
    Ok(())
}

fn allgather<T: TestElem>(c: &Communicator) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    for (n, op) in cases::<T>(false) {
        for in_place in [false, true] {
            let s = salt(2, n, in_place, 0);
            let w = what::<T>(c, "allgather", op, n, in_place);
            let want: Vec<T> = (0..world).flat_map(|r| input::<T>(r, n, op, s)).collect();
            let mine = place(c, input::<T>(rank, n, op, s));
            let mut out = place(c, vec![T::poison(); n * world]);
            if in_place {
                out[rank * n..][..n].copy_from_slice(&mine);
                c.all_gather_in_place(&mut out).map_err(err(&w))?;
            } else {
                c.all_gather(&mine, &mut out).map_err(err(&w))?;
            }
            check(&w, op, &out, &want)?;
        }
    }
    Ok(())
}

fn reduce_scatter<T: TestElem>(c: &Communicator) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    for (n, op) in cases::<T>(true) {
        for in_place in [false, true] {
            let s = salt(3, n, in_place, 0);
            let w = what::<T>(c, "reduce_scatter", op, n, in_place);
            let all = reduced::<T>(world, n * world, op, s);
            let want = &all[rank * n..][..n];
            let mut mine = input::<T>(rank, n * world, op, s);
            if in_place {
                c.reduce_scatter_in_place(&mut mine, op).map_err(err(&w))?;
                check(&w, op, &mine[rank * n..][..n], want)?;
            } else {
                let mut recv = vec![T::poison(); n];
                c.reduce_scatter(&mine, &mut recv, op).map_err(err(&w))?;
                check(&w, op, &recv, want)?;
            }
        }
    }
    Ok(())
}

fn broadcast<T: TestElem>(c: &Communicator) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    for root in 0..world {
        for (n, op) in cases::<T>(false) {
            for in_place in [false, true] {
                let s = salt(4, n, in_place, root);
                let w = format!("{} root {root}", what::<T>(c, "broadcast", op, n, in_place));
                let want = input::<T>(root, n, op, s);
                let mut out = place(c, vec![T::poison(); n]);
                if in_place {
                    if rank == root {
                        out.copy_from_slice(&want);
                    }
                    c.broadcast(&mut out, root).map_err(err(&w))?;
                } else {
                    // Non-roots pass no send buffer at all.
                    let send = place(
                        c,
                        if rank == root {
                            want.clone()
                        } else {
                            Vec::new()
                        },
                    );
                    c.broadcast_from(&send, &mut out, root).map_err(err(&w))?;
                }
                check(&w, op, &out, &want)?;
            }
        }
    }
    Ok(())
}

fn reduce<T: TestElem>(c: &Communicator) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    for root in 0..world {
        for (n, op) in cases::<T>(true) {
            for in_place in [false, true] {
                let s = salt(5, n, in_place, root);
                let w = format!("{} root {root}", what::<T>(c, "reduce", op, n, in_place));
                let mine = input::<T>(rank, n, op, s);
                if in_place {
                    let mut buf = mine.clone();
                    c.reduce_in_place(&mut buf, op, root).map_err(err(&w))?;
                    if rank == root {
                        check(&w, op, &buf, &reduced::<T>(world, n, op, s))?;
                    } else {
                        check(&format!("{w} (non-root unchanged)"), op, &buf, &mine)?;
                    }
                } else {
                    // Non-roots pass no receive buffer at all.
                    let mut recv = if rank == root {
                        vec![T::poison(); n]
                    } else {
                        Vec::new()
                    };
                    c.reduce(&mine, &mut recv, op, root).map_err(err(&w))?;
                    if rank == root {
                        check(&w, op, &recv, &reduced::<T>(world, n, op, s))?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn all_to_all<T: TestElem>(c: &Communicator) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    for (n, op) in cases::<T>(false) {
        let s = salt(6, n, false, 0);
        let w = what::<T>(c, "all_to_all", op, n, false);
        let send = input::<T>(rank, n * world, op, s);
        let mut recv = vec![T::poison(); n * world];
        c.all_to_all(&send, &mut recv).map_err(err(&w))?;
        let want: Vec<T> = (0..world)
            .flat_map(|j| input::<T>(j, n * world, op, s)[rank * n..][..n].to_vec())
            .collect();
        check(&w, op, &recv, &want)?;
    }
    Ok(())
}

/// A ring exchange in a group (every rank sends to the next and receives from the previous,
/// itself when alone), then a blocking send/recv between ranks 0 and 1.
fn sendrecv<T: TestElem>(c: &Communicator) -> Outcome {
    let (rank, world) = (c.rank(), c.world());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    for (n, op) in cases::<T>(false) {
        let s = salt(7, n, false, 0);
        let w = what::<T>(c, "group ring send/recv", op, n, false);
        let send = input::<T>(rank, n, op, s);
        let mut recv = vec![T::poison(); n];
        c.group(|g| {
            g.send(&send, next)?;
            g.recv(&mut recv, prev)?;
            Ok(())
        })
        .map_err(err(&w))?;
        check(&w, op, &recv, &input::<T>(prev, n, op, s))?;

        if world >= 2 && rank < 2 {
            let w = what::<T>(c, "blocking send/recv 0<->1", op, n, false);
            let peer = 1 - rank;
            let s2 = s ^ 0xb10c;
            let mine = input::<T>(rank, n, op, s2);
            let mut got = vec![T::poison(); n];
            if rank == 0 {
                c.send(&mine, peer).map_err(err(&w))?;
                c.recv(&mut got, peer).map_err(err(&w))?;
            } else {
                c.recv(&mut got, peer).map_err(err(&w))?;
                c.send(&mine, peer).map_err(err(&w))?;
            }
            check(&w, op, &got, &input::<T>(peer, n, op, s2))?;
        }
    }
    Ok(())
}

/// Byte counts around the sizes where a provider's eager path changes form: over `ofi_rxm`'s
/// 16 KiB bounce buffer the header rides with payloads of up to 16 352 bytes and in the
/// completion data from 16 353 to 16 384 (`wire::Compact`); 14 336 was the eager size before
/// that, and larger payloads take the rendezvous.
const EDGES: [usize; 8] = [
    14_335, 14_337, 16_351, 16_352, 16_353, 16_383, 16_384, 16_385,
];

/// Ranks 0 and 1 swap messages of every [`EDGES`] size, blocking, in both orders, then rank 0
/// sends a burst of more 16 KiB messages than the FIFO has slots (every slot reused, its
/// sender held back by credits), each checked by rank 1.
fn eager_edges(c: &Communicator) -> Outcome {
    let rank = c.rank();
    if rank > 1 {
        return Ok(());
    }
    let peer = 1 - rank;
    for (i, n) in EDGES.into_iter().enumerate() {
        for round in 0..3u64 {
            let s = salt(11, n, false, round as usize);
            let w = what::<u8>(c, "eager-edge send/recv 0<->1", ReduceOp::Sum, n, false);
            let mine = input::<u8>(rank, n, ReduceOp::Sum, s);
            let mut got = vec![u8::poison(); n];
            if (rank + i).is_multiple_of(2) {
                c.send(&mine, peer).map_err(err(&w))?;
                c.recv(&mut got, peer).map_err(err(&w))?;
            } else {
                c.recv(&mut got, peer).map_err(err(&w))?;
                c.send(&mine, peer).map_err(err(&w))?;
            }
            check(
                &w,
                ReduceOp::Sum,
                &got,
                &input::<u8>(peer, n, ReduceOp::Sum, s),
            )?;
        }
    }
    one_way(c, "a burst of eager messages 0->1", 12, |_| 16_384)
}

/// Rank 0 sends rank 1 600 messages, the `k`th of `size(k)` bytes, each checked by rank 1.
fn one_way(c: &Communicator, name: &str, kind: u64, size: impl Fn(usize) -> usize) -> Outcome {
    for k in 0..600usize {
        let n = size(k);
        let s = salt(kind, n, false, k);
        let w = what::<u8>(c, name, ReduceOp::Sum, n, false);
        if c.rank() == 0 {
            c.send(&input::<u8>(0, n, ReduceOp::Sum, s), 1)
                .map_err(err(&w))?;
        } else {
            let mut got = vec![u8::poison(); n];
            c.recv(&mut got, 0).map_err(err(&w))?;
            check(
                &w,
                ReduceOp::Sum,
                &got,
                &input::<u8>(0, n, ReduceOp::Sum, s),
            )?;
        }
    }
    Ok(())
}

/// Rank 0 sends rank 1 more small messages (0 – 96 bytes) than the FIFO has slots, then ten
/// of over 1 MiB (past every eager limit, so they go by rendezvous), and destroys its
/// communicator as soon as the last send returns, while rank 1, which started receiving only
/// later, still receives: every message must arrive, the credits rank 0 waited for meanwhile
/// included (a send returns once its message is with the transport; the transport's close
/// lets what it still holds leave).
fn last_words(c: &Communicator) -> Outcome {
    let rank = c.rank();
    if rank > 1 {
        return Ok(());
    }
    if rank == 1 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    one_way(c, "messages 0->1 before a destroy", 13, |k| match k {
        590.. => (1 << 20) + k,
        _ => k % 97,
    })
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Ranks enter the barrier at staggered times; nobody may leave before the last one entered
/// (the clock is shared: every rank runs on this host).
fn barrier(c: &Communicator) -> Outcome {
    for round in 0..5u64 {
        std::thread::sleep(std::time::Duration::from_millis(
            10 * ((c.rank() as u64 + round) % c.world() as u64),
        ));
        let entered = now_ns();
        c.barrier().map_err(err("barrier"))?;
        let left = now_ns();
        let mut last_entry = [entered];
        c.all_reduce_in_place(&mut last_entry, ReduceOp::Max)
            .map_err(err("allreduce of entry times"))?;
        if left < last_entry[0] {
            return Err(format!(
                "round {round}: rank {} left the barrier {} ns before the last rank entered",
                c.rank(),
                last_entry[0] - left
            ));
        }
    }
    for _ in 0..50 {
        c.barrier().map_err(err("back-to-back barrier"))?;
    }
    Ok(())
}

macro_rules! world_tests {
    ($scenario:literal: $($name:ident = $w:literal),* $(,)?) => {
        world_tests!($scenario, []: $($name = $w),*);
    };
    ($scenario:literal, $env:tt: $($name:ident = $w:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            launch($w, $scenario, &$env);
        }
    )*};
}

/// The TCP provider between the ranks of this host (shared memory off): the same cases.
const TCP: [(&str, &str); 1] = [("AMPCCL_SHM_DISABLE", "1")];

world_tests!("allreduce": allreduce_w1 = 1, allreduce_w2 = 2, allreduce_w3 = 3, allreduce_w4 = 4);
world_tests!("allreduce_mixed": allreduce_mixed_w2 = 2, allreduce_mixed_w3 = 3);
world_tests!("allgather": allgather_w1 = 1, allgather_w2 = 2, allgather_w3 = 3, allgather_w4 = 4);
world_tests!("reduce_scatter":
    reduce_scatter_w1 = 1, reduce_scatter_w2 = 2, reduce_scatter_w3 = 3, reduce_scatter_w4 = 4);
world_tests!("broadcast": broadcast_w1 = 1, broadcast_w2 = 2, broadcast_w3 = 3, broadcast_w4 = 4);
world_tests!("reduce": reduce_w1 = 1, reduce_w2 = 2, reduce_w3 = 3, reduce_w4 = 4);
world_tests!("all_to_all": all_to_all_w1 = 1, all_to_all_w2 = 2, all_to_all_w3 = 3, all_to_all_w4 = 4);
world_tests!("sendrecv": sendrecv_w1 = 1, sendrecv_w2 = 2, sendrecv_w3 = 3, sendrecv_w4 = 4);
world_tests!("barrier": barrier_w1 = 1, barrier_w2 = 2, barrier_w3 = 3, barrier_w4 = 4);
world_tests!("allreduce", TCP: tcp_allreduce_w2 = 2, tcp_allreduce_w3 = 3, tcp_allreduce_w4 = 4);
world_tests!("allgather", TCP: tcp_allgather_w2 = 2, tcp_allgather_w3 = 3);
world_tests!("reduce_scatter", TCP: tcp_reduce_scatter_w2 = 2, tcp_reduce_scatter_w3 = 3);
world_tests!("broadcast", TCP: tcp_broadcast_w2 = 2, tcp_broadcast_w3 = 3);
world_tests!("reduce", TCP: tcp_reduce_w2 = 2, tcp_reduce_w3 = 3);
world_tests!("all_to_all", TCP: tcp_all_to_all_w2 = 2, tcp_all_to_all_w3 = 3);
world_tests!("sendrecv", TCP: tcp_sendrecv_w2 = 2, tcp_sendrecv_w3 = 3);
world_tests!("eager_edges": eager_edges_w2 = 2);
world_tests!("eager_edges", TCP: tcp_eager_edges_w2 = 2);
world_tests!("last_words": last_words_w2 = 2);
world_tests!("last_words", TCP: tcp_last_words_w2 = 2);
world_tests!("barrier", TCP: tcp_barrier_w3 = 3);

/// The `ofi` provider (libfabric's RMA) between the ranks of this host, over `$lib`.
macro_rules! ofi_tests {
    ($lib:expr, $scenario:literal: $($name:ident = $w:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            if let Some(l) = ofi::over(Launch::new($w, $scenario), $lib) {
                l.run();
            }
        }
    )*};
}

/// libfabric 1.17's `tcp;ofi_rxm` (manual progress, application-chosen keys, offsets).
const RXM: Libfabric = Libfabric::System("tcp;ofi_rxm");
ofi_tests!(RXM, "allreduce": ofi_allreduce_w2 = 2, ofi_allreduce_w3 = 3);
ofi_tests!(RXM, "allreduce_mixed": ofi_allreduce_mixed_w2 = 2);
ofi_tests!(RXM, "allgather": ofi_allgather_w3 = 3);
ofi_tests!(RXM, "reduce_scatter": ofi_reduce_scatter_w3 = 3);
ofi_tests!(RXM, "broadcast": ofi_broadcast_w3 = 3);
ofi_tests!(RXM, "all_to_all": ofi_all_to_all_w3 = 3);
ofi_tests!(RXM, "sendrecv": ofi_sendrecv_w3 = 3);
ofi_tests!(RXM, "barrier": ofi_barrier_w3 = 3);
ofi_tests!(RXM, "eager_edges": ofi_eager_edges_w2 = 2);
ofi_tests!(RXM, "last_words": ofi_last_words_w2 = 2);

/// `ofi_rxm` with 36 KiB bounce buffers (`FI_OFI_RXM_BUFFER_SIZE`): eager messages up to
/// 32 KiB, so 4099 four-byte elements go eagerly where the default buffer sends them by
/// rendezvous.
#[test]
fn ofi_rxm_large_buffers_sendrecv_w2() {
    if let Some(l) = ofi::over(Launch::new(2, "sendrecv"), RXM) {
        l.env("FI_OFI_RXM_BUFFER_SIZE", "36864").run();
    }
}

// libfabric 1.17's `shm` (virtual addresses, no wait object), and libfabric 2.x's `tcp` (its
// own reliable datagrams, automatic progress) from Intel MPI's wheel.
ofi_tests!(Libfabric::System("shm"), "allreduce_mixed": ofi_shm_allreduce_mixed_w2 = 2);
ofi_tests!(Libfabric::System("shm"), "allgather": ofi_shm_allgather_w3 = 3);
ofi_tests!(Libfabric::IntelMpi("tcp"), "allreduce_mixed": ofi2_tcp_allreduce_mixed_w2 = 2);
ofi_tests!(Libfabric::IntelMpi("tcp"), "all_to_all": ofi2_tcp_all_to_all_w2 = 2);
// 3 ranks: messages from two peers at once (their receives are posted for any sender).
ofi_tests!(Libfabric::IntelMpi("tcp"), "allgather": ofi2_tcp_allgather_w3 = 3);
ofi_tests!(Libfabric::IntelMpi("tcp"), "sendrecv": ofi2_tcp_sendrecv_w3 = 3);
ofi_tests!(Libfabric::IntelMpi("tcp"), "eager_edges": ofi2_tcp_eager_edges_w2 = 2);
ofi_tests!(Libfabric::IntelMpi("tcp"), "last_words": ofi2_tcp_last_words_w2 = 2);
ofi_tests!(Libfabric::System("shm"), "last_words": ofi_shm_last_words_w2 = 2);
ofi_tests!(Libfabric::IntelMpi("tcp"), "all_to_all": ofi2_tcp_all_to_all_w3 = 3);

/// Over `ofi`, the 2-rank pairs: reads of the peer's offered memory (`fi_read`).
#[test]
fn ofi_broadcast_w2_pair() {
    let l = Launch::new(2, "broadcast").env("AMPCCL_ALGO_BROADCAST", "BroadcastPair");
    if let Some(l) = ofi::over(l, RXM) {
        l.run();
    }
}

/// Over `ofi` with one rail (`AMPCCL_OFI_RAILS=1`; the other tests run on the default rails,
/// which depend on the host's congestion control), and with a rail count that does not divide
/// the writes' pieces evenly, every write from 8 KiB striped (`AMPCCL_RMA_STRIPE_MIN=4K`).
#[test]
fn ofi_allreduce_mixed_w2_rails() {
    for rails in ["1", "3"] {
        let l = Launch::new(2, "allreduce_mixed")
            .env("AMPCCL_OFI_RAILS", rails)
            .env("AMPCCL_RMA_STRIPE_MIN", "4K")
            .env("AMPCCL_LOG", "info");
        if let Some(l) = ofi::over(l, Libfabric::IntelMpi("tcp")) {
            for r in l.run() {
                let took = r.stderr.contains(&format!("{rails} rail(s)"));
                assert!(took, "{}", r.stderr_tail(20));
            }
        }
    }
}

/// Over `ofi` with completion queues that have no wait object (`AMPCCL_OFI_WAIT=poll`): the
/// engine and the progress thread poll them, the latter napping while idle. Over libfabric
/// 1.17's `tcp;ofi_rxm` (manual progress: peers' writes land only while somebody polls) and
/// 2.x's `tcp`; every rank logs that its idle threads poll.
#[test]
fn ofi_polled_queues() {
    for (lib, scenario, world) in [
        (RXM, "allreduce_mixed", 3),
        (RXM, "sendrecv", 2),
        (Libfabric::IntelMpi("tcp"), "all_to_all", 2),
    ] {
        let l = Launch::new(world, scenario)
            .env("AMPCCL_OFI_WAIT", "poll")
            .env("AMPCCL_LOG", "info");
        if let Some(l) = ofi::over(l, lib) {
            for r in l.run() {
                let polled = r.stderr.contains("threads poll the completion queues");
                assert!(polled, "{}", r.stderr_tail(20));
            }
        }
    }
}

/// Over `ofi` with every local buffer registered (`AMPCCL_OFI_MR_LOCAL=1`: the path of
/// providers that ask for `FI_MR_LOCAL`, as `verbs` and `efa` do): messages from the pool of
/// registered buffers, the sources of writes and the destinations of reads registered each.
#[test]
fn ofi_local_registrations() {
    for lib in [RXM, Libfabric::IntelMpi("tcp")] {
        let mixed = Launch::new(3, "allreduce_mixed").env("AMPCCL_OFI_MR_LOCAL", "1");
        let pair = Launch::new(2, "broadcast")
            .env("AMPCCL_OFI_MR_LOCAL", "1")
            .env("AMPCCL_ALGO_BROADCAST", "BroadcastPair");
        for l in [mixed, pair] {
            if let Some(l) = ofi::over(l.env("AMPCCL_LOG", "info"), lib) {
                for r in l.run() {
                    let registered = r.stderr.contains("local buffers registered");
                    assert!(registered, "{}", r.stderr_tail(20));
                }
            }
        }
    }
}

/// Over TCP, the 2-rank pairs (reads of the peer's offered memory, writes into it).
#[test]
fn tcp_allreduce_w2_pair() {
    launch(
        2,
        "allreduce_mixed",
        &[
            ("AMPCCL_SHM_DISABLE", "1"),
            ("AMPCCL_ALGO_ALLREDUCE", "AllReducePair"),
        ],
    );
}

/// Over IPv6 end to end: the rendezvous root on `::1` (`MASTER_ADDR`), the bootstrap and the
/// TCP data connections on the address that routes to it.
#[test]
fn tcp_allreduce_over_ipv6() {
    let port = ampccl_tests::free_port().to_string();
    let token = format!("ipv6-{}", std::process::id());
    Launch::new(2, "allreduce_mixed")
        .without_unique_id()
        .env("MASTER_ADDR", "::1")
        .env("MASTER_PORT", &port)
        .env("AMPCCL_TOKEN", &token)
        .env("AMPCCL_SHM_DISABLE", "1")
        .run();
}

/// Several connections per pair (`AMPCCL_NSOCKS`), with stripes small enough that most
/// rendezvous writes are cut over all of them: each immediate completes only with every stripe.
#[test]
fn tcp_allreduce_striped_w2() {
    let env = [
        ("AMPCCL_SHM_DISABLE", "1"),
        ("AMPCCL_NSOCKS", "3"),
        ("AMPCCL_TCP_STRIPE_MIN", "4K"),
    ];
    launch(2, "allreduce_mixed", &env);
}

/// The io_uring send path (zero-copy sends for large payloads), also with stripes.
#[test]
fn tcp_allreduce_uring_w2() {
    launch(
        2,
        "allreduce_mixed",
        &[("AMPCCL_SHM_DISABLE", "1"), ("AMPCCL_TCP_IO", "uring")],
    );
    let env = [
        ("AMPCCL_SHM_DISABLE", "1"),
        ("AMPCCL_TCP_IO", "uring"),
        ("AMPCCL_NSOCKS", "2"),
        ("AMPCCL_TCP_STRIPE_MIN", "64K"),
    ];
    launch(2, "allgather", &env);
}

#[test]
fn tcp_allgather_striped_w3() {
    let env = [
        ("AMPCCL_SHM_DISABLE", "1"),
        ("AMPCCL_NSOCKS", "4"),
        ("AMPCCL_TCP_STRIPE_MIN", "4K"),
    ];
    launch(3, "allgather", &env);
}

#[test]
fn tcp_allgather_w2_pair() {
    launch(
        2,
        "allgather",
        &[
            ("AMPCCL_SHM_DISABLE", "1"),
            ("AMPCCL_ALGO_ALLGATHER", "AllGatherPair"),
        ],
    );
}

#[test]
fn tcp_broadcast_w2_pair() {
    launch(
        2,
        "broadcast",
        &[
            ("AMPCCL_SHM_DISABLE", "1"),
            ("AMPCCL_ALGO_BROADCAST", "BroadcastPair"),
        ],
    );
}

/// The operator picks `AllReducePair` only from 8 MiB on 2 ranks; forced, every case runs it
/// (the big count takes two rounds): in place straight from the output, and, without
/// cross-memory attach, through `CclOut`.
#[test]
fn allreduce_w2_pair() {
    launch(
        2,
        "allreduce",
        &[("AMPCCL_ALGO_ALLREDUCE", "AllReducePair")],
    );
}

/// Ranks in different placements: the pair's in-place rank offers its output, the other its
/// `CclOut`.
#[test]
fn allreduce_w2_pair_mixed_placement() {
    launch(
        2,
        "allreduce_mixed",
        &[("AMPCCL_ALGO_ALLREDUCE", "AllReducePair")],
    );
}

#[test]
fn allreduce_w2_pair_without_cma() {
    launch(
        2,
        "allreduce",
        &[
            ("AMPCCL_ALGO_ALLREDUCE", "AllReducePair"),
            ("AMPCCL_SHM_CMA", "0"),
        ],
    );
}

/// Beyond the cache the ring reduce-scatter's final reductions may stream into the output
/// (`reduce_out`, which times plain and streaming stores and tries both): a small assumed
/// cache puts every case from 16 KiB of input there.
#[test]
fn reducescatter_beyond_the_cache() {
    launch(3, "reduce_scatter", &[("AMPCCL_CACHE_BYTES", "65536")]);
}

/// The operator picks `AllGatherPair` on 2 ranks beyond the mesh's sizes; forced, every case
/// runs it (the big count takes several pieces and a short last one), with and without
/// cross-memory attach (it never needs it), and with a small assumed cache, which puts every
/// case from 16 KiB of output beyond it (streaming stores into the outputs).
#[test]
fn allgather_w2_pair() {
    launch(
        2,
        "allgather",
        &[("AMPCCL_ALGO_ALLGATHER", "AllGatherPair")],
    );
}

#[test]
fn allgather_w2_pair_beyond_the_cache_without_cma() {
    launch(
        2,
        "allgather",
        &[
            ("AMPCCL_ALGO_ALLGATHER", "AllGatherPair"),
            ("AMPCCL_SHM_CMA", "0"),
            ("AMPCCL_CACHE_BYTES", "65536"),
        ],
    );
}

/// Buffers in shared user memory on every rank: peers write into the outputs and read from
/// the inputs directly (the 2-rank broadcast pair and allgather pair, the allreduce pair beyond
/// the cache), without cross-memory attach.
#[test]
fn shared_buffers_w2() {
    for scenario in ["broadcast", "allgather", "allreduce"] {
        launch(2, scenario, &[(SHARED_VAR, "all"), ("AMPCCL_SHM_CMA", "0")]);
    }
}

/// Shared buffers on rank 1 only: each rank names its own memory, so the two sides of every
/// transfer differ (a window on one, user memory on the other); the pair algorithms forced.
#[test]
fn shared_buffers_mixed_w2() {
    for (scenario, env) in [
        ("broadcast", ("AMPCCL_ALGO_BROADCAST", "BroadcastPair")),
        ("allgather", ("AMPCCL_ALGO_ALLGATHER", "AllGatherPair")),
        ("allreduce", ("AMPCCL_ALGO_ALLREDUCE", "AllReducePair")),
    ] {
        launch(
            2,
            scenario,
            &[(SHARED_VAR, "odd"), ("AMPCCL_SHM_CMA", "0"), env],
        );
    }
}

/// The ring allgather receives straight into shared outputs on more ranks too (and forwards
/// from there); the broadcast chain and ring allreduce run as before.
#[test]
fn shared_buffers_w3() {
    for scenario in ["allgather", "broadcast", "allreduce"] {
        launch(3, scenario, &[(SHARED_VAR, "odd")]);
    }
}

/// The communicator's topology matches where the launcher placed the ranks: the host of each
/// rank (`AMPCCL_TEST_HOST`; hosts are numbered by their lowest rank, and the tests place them
/// so), and each rank among its host's ranks.
fn topology(c: &Communicator) -> Outcome {
    let t = c.topology();
    let host = std::env::var("AMPCCL_TEST_HOST").map_or(Ok(0), |h| h.parse::<usize>());
    let host = host.map_err(|e| format!("AMPCCL_TEST_HOST: {e}"))?;
    let want_hosts = std::env::var("EXPECT_HOSTS").map_or(1, |h| h.parse().unwrap_or(0));
    if t.host_of(c.rank()) != host || t.hosts() != want_hosts {
        return Err(format!(
            "rank {} on host {host} of {want_hosts}: the topology says {} ({})",
            c.rank(),
            t.host_of(c.rank()),
            t.summary()
        ));
    }
    if !t.local_ranks().contains(&c.rank()) {
        return Err("a rank is not among its host's ranks".into());
    }
    Ok(())
}

/// The communicator runs on the provider `EXPECT_TRANSPORT` names, and a barrier passes.
fn transport(c: &Communicator) -> Outcome {
    let want = std::env::var("EXPECT_TRANSPORT").map_err(|e| format!("EXPECT_TRANSPORT: {e}"))?;
    ensure(c.transport_name() == want, || {
        format!("connected by {}, not {want}", c.transport_name())
    })?;
    barrier(c)
}

/// Across hosts without `AMPCCL_TRANSPORT`, `ofi` is taken where libfabric offers a provider
/// that `AMPCCL_OFI_FABRICS` lists (here libfabric 2.4's `tcp`, standing in for `verbs` or
/// `efa`), and TCP where it offers none of them (the system's socket providers against a
/// list naming `verbs`: libfabric is asked, unlike with the default list on a host without an
/// RDMA device, where rank 0 does not load it at all).
#[test]
fn ofi_is_probed_across_hosts_on_a_fabric_only() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let on_fabric = Launch::new(2, "transport")
        .on_hosts(&hosts, &[0, 1])
        .env("AMPCCL_OFI_FABRICS", "tcp")
        .env("EXPECT_TRANSPORT", "ofi");
    if let Some(l) = ofi::over(on_fabric, Libfabric::IntelMpi("tcp")) {
        l.env_remove("AMPCCL_TRANSPORT")
            .env_remove("AMPCCL_OFI_PROVIDER")
            .run();
    }
    let sockets = Launch::new(2, "transport")
        .on_hosts(&hosts, &[0, 1])
        .env("AMPCCL_OFI_FABRICS", "verbs")
        .env("EXPECT_TRANSPORT", "tcp");
    if let Some(l) = ofi::over(sockets, RXM) {
        l.env_remove("AMPCCL_TRANSPORT")
            .env_remove("AMPCCL_OFI_PROVIDER")
            .run();
    }
}

/// Across hosts over libfabric's `tcp`, rank 0 opens one rail where its host's TCP congestion
/// control does not pace connections (reno here, which every namespace may choose; cubic
/// likewise) and the default four where it does (BBR, where the machine allows it);
/// `AMPCCL_OFI_RAILS` overrides either.
#[test]
fn ofi_hosts_rails_follow_congestion_control() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    for (cc, set, want) in [("reno", None, 1), ("bbr", None, 4), ("reno", Some("3"), 3)] {
        if let Err(why) = (0..2).try_for_each(|i| hosts.set_congestion_control(i, cc)) {
            assert!(cc == "bbr", "{why}");
            println!("skipped {cc}: {why}");
            continue;
        }
        let mut launch = Launch::new(2, "allreduce_mixed")
            .on_hosts(&hosts, &[0, 1])
            .env("AMPCCL_LOG", "info");
        if let Some(n) = set {
            launch = launch.env("AMPCCL_OFI_RAILS", n);
        }
        let Some(launch) = ofi::over(launch, Libfabric::IntelMpi("tcp")) else {
            return;
        };
        for r in launch.run() {
            let took = r.stderr.contains(&format!("{want} rail(s)"));
            assert!(
                took,
                "{cc}, AMPCCL_OFI_RAILS={set:?}: {}",
                r.stderr_tail(20)
            );
        }
    }
}

/// Runs `scenario` with rank `r` on emulated host `placement[r]` (a network namespace with a
/// private `/dev/shm` each, see `docs/TESTING.md`): ranks on different hosts talk over TCP, or
/// over the `ofi` provider with `lib`.
fn across_hosts(scenario: &str, placement: &[usize], lib: Option<Libfabric>) {
    let hosts = placement.iter().max().map_or(1, |h| h + 1);
    let Some(hosts) = Hosts::new_or_skip(hosts) else {
        return;
    };
    let launch = Launch::new(placement.len(), scenario).on_hosts(&hosts, placement);
    let launch = match lib {
        Some(lib) => ofi::over(launch, lib),
        None => Some(launch),
    };
    if let Some(l) = launch {
        l.run();
    }
}

macro_rules! host_tests {
    ($placement:expr; $($name:ident = $scenario:literal),* $(,)?) => {
        host_tests!(None, $placement; $($name = $scenario),*);
    };
    ($lib:expr, $placement:expr; $($name:ident = $scenario:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            across_hosts($scenario, &$placement, $lib);
        }
    )*};
}

host_tests!([0, 1];
    hosts_2x1_allreduce = "allreduce",
    hosts_2x1_allgather = "allgather",
    hosts_2x1_reduce_scatter = "reduce_scatter",
    hosts_2x1_broadcast = "broadcast",
    hosts_2x1_reduce = "reduce",
    hosts_2x1_all_to_all = "all_to_all",
    hosts_2x1_sendrecv = "sendrecv",
    hosts_2x1_barrier = "barrier",
);
host_tests!([0, 1, 2];
    hosts_3x1_allreduce = "allreduce",
    hosts_3x1_allgather = "allgather",
    hosts_3x1_broadcast = "broadcast",
    hosts_3x1_reduce_scatter = "reduce_scatter",
);
// Shared memory within each host, TCP across (per-pair providers).
host_tests!([0, 0, 1, 1];
    hosts_2x2_allreduce = "allreduce",
    hosts_2x2_allgather = "allgather",
    hosts_2x2_reduce_scatter = "reduce_scatter",
    hosts_2x2_broadcast = "broadcast",
    hosts_2x2_reduce = "reduce",
    hosts_2x2_all_to_all = "all_to_all",
    hosts_2x2_sendrecv = "sendrecv",
    hosts_2x2_barrier = "barrier",
);
host_tests!([0, 1, 0, 2];
    hosts_interleaved_allreduce = "allreduce",
    hosts_interleaved_allgather = "allgather",
);
// The same across hosts over `ofi` (`tcp;ofi_rxm`), for every pair.
host_tests!(Some(RXM), [0, 1];
    ofi_hosts_2x1_allreduce = "allreduce",
    ofi_hosts_2x1_allgather = "allgather",
    ofi_hosts_2x1_reduce_scatter = "reduce_scatter",
    ofi_hosts_2x1_broadcast = "broadcast",
    ofi_hosts_2x1_reduce = "reduce",
    ofi_hosts_2x1_all_to_all = "all_to_all",
    ofi_hosts_2x1_sendrecv = "sendrecv",
    ofi_hosts_2x1_barrier = "barrier",
);
host_tests!(Some(RXM), [0, 1, 2];
    ofi_hosts_3x1_allreduce = "allreduce",
    ofi_hosts_3x1_allgather = "allgather",
);
host_tests!(Some(RXM), [0, 0, 1, 1];
    ofi_hosts_2x2_allreduce = "allreduce",
    ofi_hosts_2x2_all_to_all = "all_to_all",
);
host_tests!(Some(Libfabric::IntelMpi("tcp")), [0, 1];
    ofi2_tcp_hosts_2x1_allreduce = "allreduce",
);

#[test]
fn topology_on_one_host() {
    launch(3, "topology", &[]);
}

/// 3 hosts with 2, 1 and 2 ranks: each rank finds its host in the communicator's topology.
#[test]
fn hosts_topology() {
    let Some(hosts) = Hosts::new_or_skip(3) else {
        return;
    };
    Launch::new(5, "topology")
        .on_hosts(&hosts, &[0, 0, 1, 2, 2])
        .env("EXPECT_HOSTS", "3")
        .run();
}

/// `AMPCCL_SOCKET_IFNAME` (NCCL's syntax) picks the interface ranks listen on: every host's
/// `eth0` here, so the job runs as with the default (the interface that routes to the root).
#[test]
fn hosts_socket_ifname() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    for spec in ["eth0", "=eth0", "^lo"] {
        Launch::new(2, "allreduce")
            .on_hosts(&hosts, &[0, 1])
            .env("AMPCCL_SOCKET_IFNAME", spec)
            .run();
    }
}
