//! Failure handling across processes: bad arguments, mismatched calls, dead, missing, stuck
//! and aborting peers. Every scenario must end in seconds with the documented error class.

use std::time::{Duration, Instant};

use ampccl::{Communicator, Error, ReduceOp};
use ampccl_tests::ofi::{self, Libfabric};
use ampccl_tests::{
    Hosts, Launch, Outcome, RankResult, describe, ensure, err, init_comm, rank_world,
    shm_segments_of, worker,
};

/// How long a failure may take to surface once its cause happened.
const PROMPT: Duration = Duration::from_secs(5);

#[test]
fn worker_entry() {
    worker(|scenario| match scenario {
        "bad_arguments" => bad_arguments(),
        "send_to_self" => send_to_self(),
        "mismatch_count" => mismatch(|c| {
            let n = 100 + c.rank();
            c.all_reduce(&vec![1f32; n], &mut vec![0f32; n], ReduceOp::Sum)
        }),
        "mismatch_kind" => mismatch(|c| {
            let send = vec![1f32; 100];
            if c.rank() == 0 {
                c.all_reduce(&send, &mut vec![0f32; 100], ReduceOp::Sum)
            } else {
                c.all_gather(&send, &mut vec![0f32; 100 * c.world()])
            }
        }),
        "mismatch_dtype" => mismatch(|c| {
            if c.rank() == 0 {
                c.all_reduce(&[1f32; 100], &mut [0f32; 100], ReduceOp::Sum)
            } else {
                c.all_reduce(&[1i32; 100], &mut [0i32; 100], ReduceOp::Sum)
            }
        }),
        "mismatch_op" => mismatch(|c| {
            // A matching call of the same shape first: the plan it leaves behind for the
            // next call of that shape must not hide the differing operator.
            c.all_reduce(&[1f32; 100], &mut [0f32; 100], ReduceOp::Sum)?;
            let op = [ReduceOp::Sum, ReduceOp::Max][c.rank() % 2];
            c.all_reduce(&[1f32; 100], &mut [0f32; 100], op)
        }),
        "mismatch_kind_small" => mismatch(|c| {
            for n in [1usize, 16, 300] {
                let send = vec![1f32; n];
                if c.rank() == 0 {
                    c.all_reduce(&send, &mut vec![0f32; n], ReduceOp::Sum)?;
                } else {
                    c.all_gather(&send, &mut vec![0f32; n * c.world()])?;
                }
            }
            Ok(())
        }),
        "mismatch_p2p_len" => mismatch(|c| {
            // A receive small enough to travel eagerly against a send large enough for the
            // rendezvous: the sender waits for a clear-to-send, the receiver for a message.
            if c.rank() == 0 {
                c.send(&vec![1f32; 1 << 20], 1)
            } else {
                c.recv(&mut [0f32; 100], 0)
            }
        }),
        "mismatch_rendezvous_len" => mismatch(|c| {
            // Both lengths past every eager size but within `ofi`'s writes-complete range
            // (`AMPCCL_OFI_WRITES_COMPLETE_MAX`): the receiver's clear-to-send asks for no
            // immediate, the sender finds the sizes differ and must still send one.
            if c.rank() == 0 {
                c.send(&vec![1f32; 10 << 10], 1)
            } else {
                c.recv(&mut vec![0f32; 9 << 10], 0)
            }
        }),
        "mismatch_reduce_root" => mismatch(|c| {
            // Every rank thinks it is the root: on 2 ranks both wait to receive.
            let root = c.rank();
            for n in [4usize, 100_000] {
                c.reduce(&vec![1f32; n], &mut vec![0f32; n], ReduceOp::Sum, root)?;
            }
            Ok(())
        }),
        "mismatch_recv_reduce" => mismatch(|c| {
            // Rank 0 receives from rank 1, which runs a reduce rooted at itself: two receivers.
            if c.rank() == 0 {
                c.recv(&mut [0f32; 10], 1)
            } else {
                c.reduce(&[1f32; 10], &mut [0f32; 10], ReduceOp::Sum, 1)
            }
        }),
        "killed_rank_abort" => killed_rank(true, big_allreduce),
        "killed_rank_sigkill" => killed_rank(false, big_allreduce),
        "killed_rank_small_allgather" => killed_rank(true, |c| {
            let mut out = vec![0u8; 1024 * c.world()];
            c.all_gather(&[1u8; 1024], &mut out)
        }),
        "killed_rank_small_allreduce" => killed_rank(true, |c| {
            c.all_reduce_in_place(&mut [1f32; 16], ReduceOp::Sum)
        }),
        "killed_rank_small_broadcast" => killed_rank(true, |c| c.broadcast(&mut [1u8; 64], 0)),
        "killed_rank_barrier" => killed_rank(true, |c| c.barrier()),
        "missing_peer" => missing_peer(),
        "stuck_peer" => stuck_peer(),
        "abort" => abort(),
        "abort_after_completion" => abort_after_completion(),
        "link_lost" => link_lost(),
        "bad_socket_ifname" => expect_err(
            "init",
            init_comm_raw(),
            |e| matches!(e, Error::InvalidArgument(m) if m.contains("AMPCCL_SOCKET_IFNAME")),
        ),
        "bad_ofi_wait" => expect_err(
            "init",
            init_comm_raw(),
            |e| matches!(e, Error::InvalidArgument(m) if m.contains("AMPCCL_OFI_WAIT")),
        ),
        s => Err(format!("unknown scenario {s:?}")),
    });
}

/// Fails unless `r` is an error accepted by `ok`.
fn expect_err<T>(what: &str, r: ampccl::Result<T>, ok: impl Fn(&Error) -> bool) -> Outcome {
    match r {
        Ok(_) => Err(format!("{what}: succeeded, expected an error")),
        Err(e) if ok(&e) => {
            eprintln!("{what}: {e}");
            Ok(())
        }
        Err(e) => Err(format!("{what}: wrong error {e:?}")),
    }
}

fn invalid_arg(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_))
}

/// Every bad call fails locally with `InvalidArgument`; the communicator stays usable (no rank
/// communicated, so a correct collective still lines up afterwards).
fn bad_arguments() -> Outcome {
    let c = init_comm()?;
    let (rank, world) = (c.rank(), c.world());
    let t = Instant::now();
    let mut buf = vec![1f32; 8];
    let mut short = vec![0f32; 7];
    expect_err(
        "allreduce, short output",
        c.all_reduce(&buf, &mut short, ReduceOp::Sum),
        invalid_arg,
    )?;
    expect_err(
        "allgather, short output",
        c.all_gather(&buf, &mut vec![0f32; 8 * world - 1]),
        invalid_arg,
    )?;
    expect_err(
        "reduce_scatter, short input",
        c.reduce_scatter(&vec![0f32; 8 * world - 1], &mut buf, ReduceOp::Sum),
        invalid_arg,
    )?;
    expect_err(
        "broadcast, root = world",
        c.broadcast(&mut buf, world),
        invalid_arg,
    )?;
    expect_err(
        "reduce, root = world",
        c.reduce_in_place(&mut buf, ReduceOp::Sum, world),
        invalid_arg,
    )?;
    expect_err("send, peer = world", c.send(&buf, world), invalid_arg)?;
    expect_err("recv, peer = world", c.recv(&mut buf, world), invalid_arg)?;
    expect_err(
        "group send, peer = world",
        c.group(|g| g.send(&buf, world + 3)),
        invalid_arg,
    )?;
    if world > 1 {
        let mut odd = vec![0f32; world + 1];
        expect_err(
            "reduce_scatter_in_place, length not divisible by world",
            c.reduce_scatter_in_place(&mut odd, ReduceOp::Sum),
            invalid_arg,
        )?;
        expect_err(
            "all_gather_in_place, length not divisible by world",
            c.all_gather_in_place(&mut odd),
            invalid_arg,
        )?;
        expect_err(
            "all_to_all, length not divisible by world",
            c.all_to_all(&odd.clone(), &mut odd),
            invalid_arg,
        )?;
    }
    ensure(t.elapsed() < Duration::from_secs(1), || {
        format!("the argument checks took {:?}", t.elapsed())
    })?;
    let mut x = [rank as f32 + 1.0];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)
        .map_err(err("allreduce after the bad calls"))?;
    let want = (world * (world + 1) / 2) as f32;
    ensure(x[0] == want, || {
        format!("allreduce gave {} not {want}", x[0])
    })
}

/// A send to this rank outside a group is refused locally and leaves the communicator usable.
fn send_to_self() -> Outcome {
    let c = init_comm()?;
    expect_err("send to self", c.send(&[1f32; 4], c.rank()), invalid_arg)?;
    let mut x = [1u32];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)
        .map_err(err("allreduce after the refused send"))?;
    ensure(x[0] == c.world() as u32, || {
        format!("allreduce gave {}", x[0])
    })
}

/// Both ranks must fail promptly with `InvalidUsage` or `Remote` (not hang into a timeout).
fn mismatch(call: impl Fn(&Communicator) -> ampccl::Result<()>) -> Outcome {
    let c = init_comm()?;
    // Line the ranks up so the measured time is the mismatch's alone.
    c.all_reduce_in_place(&mut [0u8; 1], ReduceOp::Sum)
        .map_err(err("warm-up allreduce"))?;
    let t = Instant::now();
    expect_err("mismatched call", call(&c), |e| {
        matches!(e, Error::InvalidUsage(_) | Error::Remote(_))
    })?;
    ensure(t.elapsed() < PROMPT, || {
        format!("the mismatch took {:?} to surface", t.elapsed())
    })
}

/// A 4 MiB allreduce (the ring's and the pair's link waits).
fn big_allreduce(c: &Communicator) -> ampccl::Result<()> {
    c.all_reduce_in_place(&mut vec![1f32; 1 << 20], ReduceOp::Max)
}

/// Rank 0 aborts its communicator right after a collective completed on it: the others' same
/// collective, matched and complete as far as rank 0 is concerned, must complete too (a
/// peer's failure fails only what still needs that peer). Many rounds, each on a fresh child
/// communicator, at sizes of every protocol (eager, rendezvous, pipelined).
fn abort_after_completion() -> Outcome {
    let c = init_comm()?;
    for round in 0..60 {
        let child = c
            .split(0, c.rank() as i32)
            .map_err(err("split"))?
            .ok_or("split gave no communicator")?;
        let n = [1usize, 4 << 10, 1 << 20][round % 3];
        let mut buf = vec![1f32; n];
        let r = child.all_reduce_in_place(&mut buf, ReduceOp::Sum);
        r.map_err(err(format!("round {round}: allreduce of {n} floats")))?;
        if c.rank() == 0 {
            child.abort();
        } else {
            child
                .destroy()
                .map_err(err(format!("round {round}: destroy")))?;
        }
        ensure(buf.iter().all(|&x| x == c.world() as f32), || {
            format!("round {round}: wrong sum")
        })?;
        c.barrier().map_err(err("barrier"))?;
    }
    Ok(())
}

/// Both ranks loop over 1 MiB allreduces until the launcher takes host 1's link down: each
/// must then fail within `AMPCCL_TIMEOUT_S` (3 s here) and some seconds of slack, naming the
/// rank it waited for.
fn link_lost() -> Outcome {
    let c = init_comm()?;
    let start = Instant::now();
    let mut buf = vec![1f32; 1 << 18];
    loop {
        let t = Instant::now();
        match c.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
            Ok(()) if start.elapsed() > Duration::from_secs(20) => {
                return Err("still running 20 s after the start".into());
            }
            Ok(()) => {}
            Err(e @ (Error::Timeout(_) | Error::Remote(_))) => {
                let peer = format!("rank {}", 1 - c.rank());
                ensure(format!("{e}").contains(&peer), || {
                    format!("{e} names not {peer}")
                })?;
                return ensure(t.elapsed() < Duration::from_secs(8), || {
                    format!("the failing call took {:?}", t.elapsed())
                });
            }
            Err(e) => return Err(format!("expected Timeout or Remote: {e:?}")),
        }
    }
}

/// Rank 1 dies while the others loop over `op`: their pending call must fail with `Remote`
/// naming rank 1, promptly, whatever the operation waits on. `self_abort`: rank 1 calls
/// `process::abort()` after a few iterations; otherwise it loops until the launcher SIGKILLs
/// it.
fn killed_rank(self_abort: bool, op: fn(&Communicator) -> ampccl::Result<()>) -> Outcome {
    let c = init_comm()?;
    let start = Instant::now();
    for i in 0.. {
        if c.rank() == 1 && self_abort && i == 3 {
            std::process::abort();
        }
        let t = Instant::now();
        let r = op(&c);
        if c.rank() == 1 {
            r.map_err(err("rank 1 allreduce before dying"))?;
            continue;
        }
        match r {
            Ok(()) if start.elapsed() > Duration::from_secs(30) => {
                return Err(format!("still running after {i} iterations"));
            }
            Ok(()) => {}
            Err(Error::Remote(m)) if m.contains("rank 1") => {
                eprintln!("iteration {i}: Remote({m}) after {:?}", t.elapsed());
                return ensure(t.elapsed() < PROMPT, || {
                    format!("the failing call took {:?}", t.elapsed())
                });
            }
            Err(e) => {
                return Err(format!(
                    "iteration {i}: expected Remote naming rank 1: {e:?}"
                ));
            }
        }
    }
    unreachable!()
}

/// World 2 with only rank 0 launched and `AMPCCL_TIMEOUT_S=2`: init times out.
fn missing_peer() -> Outcome {
    let t = Instant::now();
    let r = init_comm_raw();
    let el = t.elapsed();
    expect_err("init without rank 1", r, |e| matches!(e, Error::Timeout(_)))?;
    ensure(el < PROMPT, || format!("init took {el:?} to time out"))
}

fn init_comm_raw() -> ampccl::Result<Communicator> {
    let (rank, world) = rank_world();
    let id = ampccl::UniqueId::from_hex(&std::env::var("AMPCCL_UNIQUE_ID").unwrap_or_default())?;
    Communicator::init(&id, rank, world)
}

/// Rank 1 joins but never calls the collective (`AMPCCL_TIMEOUT_S=2`): rank 0 times out.
fn stuck_peer() -> Outcome {
    let c = init_comm()?;
    if c.rank() == 1 {
        std::thread::sleep(Duration::from_secs(6));
        return Ok(());
    }
    let t = Instant::now();
    let r = c.all_reduce(&[1f32; 1024], &mut [0f32; 1024], ReduceOp::Sum);
    let el = t.elapsed();
    expect_err("allreduce with a stuck peer", r, |e| {
        matches!(e, Error::Timeout(_))
    })?;
    ensure(el >= Duration::from_millis(1500) && el < PROMPT, || {
        format!("timed out after {el:?} (AMPCCL_TIMEOUT_S=2)")
    })
}

/// Rank 0 aborts while rank 1 waits in an allreduce: rank 1 fails with `Remote` promptly, and
/// rank 0's later calls fail (`Aborted`).
fn abort() -> Outcome {
    let c = init_comm()?;
    c.all_reduce_in_place(&mut [0u8; 1], ReduceOp::Sum)
        .map_err(err("warm-up allreduce"))?;
    if c.rank() == 0 {
        std::thread::sleep(Duration::from_millis(500));
        c.abort();
        expect_err(
            "allreduce after abort",
            c.all_reduce_in_place(&mut [1f32; 16], ReduceOp::Sum),
            |e| matches!(e, Error::Aborted(_) | Error::InvalidUsage(_)),
        )?;
        // Keep the process alive until rank 1 saw the abort (it is not a crash).
        std::thread::sleep(Duration::from_secs(2));
        return Ok(());
    }
    let t = Instant::now();
    let r = c.all_reduce_in_place(&mut [1f32; 1 << 16], ReduceOp::Sum);
    let el = t.elapsed();
    expect_err("allreduce while rank 0 aborts", r, |e| {
        matches!(e, Error::Remote(_))
    })?;
    ensure(el < PROMPT, || format!("the abort took {el:?} to surface"))
}

// ---------------------------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------------------------

fn quick(world: usize, scenario: &str) -> Vec<RankResult> {
    quick_with(world, scenario, &[])
}

/// As [`quick`], with more environment.
fn quick_with(world: usize, scenario: &str, env: &[(&str, &str)]) -> Vec<RankResult> {
    run_quick(launch_with(world, scenario, env))
}

/// As [`quick_with`], over `ofi` on libfabric 1.17's `tcp;ofi_rxm` (without it, skipped).
fn ofi_quick_with(world: usize, scenario: &str, env: &[(&str, &str)]) {
    if let Some(l) = ofi::over(launch_with(world, scenario, env), RXM) {
        run_quick(l);
    }
}

fn launch_with(world: usize, scenario: &str, env: &[(&str, &str)]) -> Launch {
    env.iter()
        .fold(Launch::new(world, scenario), |l, (k, v)| l.env(k, v))
}

/// Runs `launch` with a 30 s operation timeout, all of it within a minute.
fn run_quick(launch: Launch) -> Vec<RankResult> {
    launch
        .env("AMPCCL_TIMEOUT_S", "30")
        .deadline(Duration::from_secs(60))
        .run()
}

#[test]
fn bad_arguments_w1() {
    quick(1, "bad_arguments");
}

#[test]
fn bad_arguments_w2() {
    quick(2, "bad_arguments");
}

#[test]
fn bad_arguments_w3() {
    quick(3, "bad_arguments");
}

#[test]
fn send_to_self_w2() {
    quick(2, "send_to_self");
}

#[test]
fn mismatch_count_w2() {
    quick(2, "mismatch_count");
}

#[test]
fn mismatch_kind_w2() {
    quick(2, "mismatch_kind");
}

#[test]
fn mismatch_dtype_w2() {
    quick(2, "mismatch_dtype");
}

#[test]
fn mismatch_kind_small_w2() {
    quick(2, "mismatch_kind_small");
}

#[test]
fn mismatch_kind_small_w3() {
    quick(3, "mismatch_kind_small");
}

#[test]
fn mismatch_p2p_len_w2() {
    quick(2, "mismatch_p2p_len");
}

#[test]
fn mismatch_rendezvous_len_w2() {
    quick(2, "mismatch_rendezvous_len");
}

#[test]
fn mismatch_reduce_root_w2() {
    quick(2, "mismatch_reduce_root");
}

#[test]
fn mismatch_reduce_root_w3() {
    quick(3, "mismatch_reduce_root");
}

#[test]
fn mismatch_recv_reduce_w2() {
    quick(2, "mismatch_recv_reduce");
}

#[test]
fn mismatch_op_w2() {
    quick(2, "mismatch_op");
}

/// No `ampccl.<pid>.*` segment of any rank may outlive it.
fn assert_no_shm_left(results: &[RankResult]) {
    for r in results {
        let left = shm_segments_of(r.pid);
        assert!(
            left.is_empty(),
            "rank {} (pid {}) left shared memory behind: {left:?}",
            r.rank,
            r.pid
        );
    }
}

fn assert_died(results: &[RankResult], rank: usize, signal: i32) {
    use std::os::unix::process::ExitStatusExt;
    let r = &results[rank];
    assert_eq!(
        r.status.signal(),
        Some(signal),
        "rank {rank} was expected to die of signal {signal}: {}\n{}",
        describe(&r.status),
        r.stderr_tail(20)
    );
}

#[test]
fn killed_rank_abort_w2() {
    let res = Launch::new(2, "killed_rank_abort")
        .may_die(1)
        .deadline(Duration::from_secs(60))
        .run();
    assert_died(&res, 1, libc::SIGABRT);
    assert_no_shm_left(&res);
}

#[test]
fn killed_rank_sigkill_w2() {
    let res = Launch::new(2, "killed_rank_sigkill")
        .kill_after(1, Duration::from_secs(3))
        .deadline(Duration::from_secs(60))
        .run();
    assert_died(&res, 1, libc::SIGKILL);
    assert_no_shm_left(&res);
}

/// As `killed_rank_abort_w2`, but the launcher reaps in rank order (blocked on rank 0), so the
/// dead rank 1 stays a zombie while rank 0 waits for it. Rank 0 must still see it die promptly.
#[test]
fn killed_rank_unreaped_w2() {
    let res = Launch::new(2, "killed_rank_abort")
        .may_die(1)
        .reap_in_order()
        .env("AMPCCL_TIMEOUT_S", "10")
        .deadline(Duration::from_secs(60))
        .run();
    assert_died(&res, 1, libc::SIGABRT);
    assert_no_shm_left(&res);
}

/// Rank 1 aborts in the middle of small operations, whose waits are not all link operations
/// (eager messages, notifies between streams, the mesh's side streams): the survivors still
/// name it within a fraction of a second, not after `AMPCCL_TIMEOUT_S`.
fn killed_in(world: usize, scenario: &str) {
    killed_in_with(world, scenario, &[]);
}

/// As [`killed_in`], with more environment.
fn killed_in_with(world: usize, scenario: &str, env: &[(&str, &str)]) {
    let mut launch = Launch::new(world, scenario);
    for (k, v) in env {
        launch = launch.env(k, v);
    }
    killed(launch);
}

/// Runs `launch`, whose rank 1 aborts: it must die of the abort, and the others must name it.
fn killed(launch: Launch) {
    let res = launch
        .may_die(1)
        .env("AMPCCL_TIMEOUT_S", "60")
        .deadline(Duration::from_secs(45))
        .run();
    assert_died(&res, 1, libc::SIGABRT);
    assert_no_shm_left(&res);
}

#[test]
fn killed_rank_small_allgather_w2() {
    killed_in(2, "killed_rank_small_allgather");
}

#[test]
fn killed_rank_small_allgather_w3() {
    killed_in(3, "killed_rank_small_allgather");
}

#[test]
fn killed_rank_small_allreduce_w3() {
    killed_in(3, "killed_rank_small_allreduce");
}

#[test]
fn killed_rank_small_broadcast_w3() {
    killed_in(3, "killed_rank_small_broadcast");
}

#[test]
fn killed_rank_barrier_w2() {
    killed_in(2, "killed_rank_barrier");
}

#[test]
fn missing_peer_w2() {
    Launch::new(2, "missing_peer")
        .only_ranks(&[0])
        .env("AMPCCL_TIMEOUT_S", "2")
        .deadline(Duration::from_secs(20))
        .run();
}

#[test]
fn stuck_peer_w2() {
    Launch::new(2, "stuck_peer")
        .env("AMPCCL_TIMEOUT_S", "2")
        .deadline(Duration::from_secs(30))
        .run();
}

#[test]
fn abort_after_completion_w2() {
    quick(2, "abort_after_completion");
}

#[test]
fn abort_after_completion_w3() {
    quick(3, "abort_after_completion");
}

/// The TCP provider between the ranks of this host (shared memory off).
const TCP: [(&str, &str); 1] = [("AMPCCL_SHM_DISABLE", "1")];

/// Over TCP a dead rank's connections close: the survivors name it as promptly.
#[test]
fn tcp_killed_rank_small_allgather_w3() {
    killed_in_with(3, "killed_rank_small_allgather", &TCP);
}

#[test]
fn tcp_killed_rank_abort_w2() {
    killed_in_with(2, "killed_rank_abort", &TCP);
}

#[test]
fn tcp_mismatch_kind_small_w2() {
    quick_with(2, "mismatch_kind_small", &TCP);
}

#[test]
fn tcp_mismatch_reduce_root_w2() {
    quick_with(2, "mismatch_reduce_root", &TCP);
}

#[test]
fn tcp_abort_after_completion_w2() {
    quick_with(2, "abort_after_completion", &TCP);
}

/// An `AMPCCL_SOCKET_IFNAME` that matches no interface fails init at once, naming it.
#[test]
fn bad_socket_ifname_w2() {
    quick_with(
        2,
        "bad_socket_ifname",
        &[("AMPCCL_SOCKET_IFNAME", "=nosuchif0")],
    );
}

#[test]
fn abort_w2() {
    quick(2, "abort");
}

/// Rank 1 aborts during small allgathers with the ranks placed on emulated hosts as
/// `placement` says: every survivor, on its host (shared memory) or another (TCP), names it.
/// Over the `ofi` provider with `lib` when given.
fn killed_on_hosts(placement: &[usize], lib: Option<Libfabric>) {
    let hosts = placement.iter().max().map_or(1, |h| h + 1);
    let Some(hosts) = Hosts::new_or_skip(hosts) else {
        return;
    };
    let launch =
        Launch::new(placement.len(), "killed_rank_small_allgather").on_hosts(&hosts, placement);
    let launch = match lib {
        Some(lib) => ofi::over(launch, lib),
        None => Some(launch),
    };
    let Some(launch) = launch else { return };
    let res = launch
        .may_die(1)
        .env("AMPCCL_TIMEOUT_S", "60")
        .deadline(Duration::from_secs(45))
        .run();
    assert_died(&res, 1, libc::SIGABRT);
}

/// A rank killed on another host: its connections close, the survivor names it.
#[test]
fn hosts_killed_rank_small_allgather() {
    killed_on_hosts(&[0, 1], None);
}

/// Shared memory within hosts, TCP across: rank 1's host peer and the other host's ranks.
#[test]
fn hosts_2x2_killed_rank_small_allgather() {
    killed_on_hosts(&[0, 0, 1, 1], None);
}

/// libfabric 1.17's `tcp;ofi_rxm`, which the `ofi` tests run over.
const RXM: Libfabric = Libfabric::System("tcp;ofi_rxm");

/// An `AMPCCL_OFI_WAIT` other than `fd` or `poll` fails init at once on every rank, naming it.
#[test]
fn ofi_bad_wait_w2() {
    ofi_quick_with(2, "bad_ofi_wait", &[("AMPCCL_OFI_WAIT", "spin")]);
}

/// Over `ofi`, sends to a dead rank stop moving (the provider keeps failing to reconnect): the
/// survivors name it as promptly, on one host and across hosts.
#[test]
fn ofi_killed_rank_small_allgather_w3() {
    if let Some(l) = ofi::over(Launch::new(3, "killed_rank_small_allgather"), RXM) {
        killed(l);
    }
}

/// The same with polled completion queues (`AMPCCL_OFI_WAIT=poll`): the progress thread,
/// napping between looks instead of blocking, still notices the dead rank.
#[test]
fn ofi_polled_killed_rank_small_allgather_w3() {
    let l = Launch::new(3, "killed_rank_small_allgather").env("AMPCCL_OFI_WAIT", "poll");
    if let Some(l) = ofi::over(l, RXM) {
        killed(l);
    }
}

#[test]
fn ofi_hosts_killed_rank_small_allgather() {
    killed_on_hosts(&[0, 1], Some(RXM));
}

/// A host's link taken down in the middle of a collective: nothing closes, nothing arrives;
/// both ranks fail within `AMPCCL_TIMEOUT_S`, naming the other.
#[test]
fn hosts_link_down_mid_collective() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let cut = hosts.clone();
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        cut.link_down(1)
    });
    Launch::new(2, "link_lost")
        .on_hosts(&hosts, &[0, 1])
        .env("AMPCCL_TIMEOUT_S", "3")
        .deadline(Duration::from_secs(40))
        .run();
    cutter.join().expect("cutter").expect("link down");
}

/// As `hosts_link_down_mid_collective`, over `ofi`.
#[test]
fn ofi_hosts_link_down_mid_collective() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let launch = Launch::new(2, "link_lost").on_hosts(&hosts, &[0, 1]);
    let Some(launch) = ofi::over(launch, RXM) else {
        return;
    };
    let cut = hosts.clone();
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        cut.link_down(1)
    });
    launch
        .env("AMPCCL_TIMEOUT_S", "3")
        .deadline(Duration::from_secs(40))
        .run();
    cutter.join().expect("cutter").expect("link down");
}

/// An eager receive's clear-to-send leaves only when its message stays away: a sender that
/// takes the rendezvous for a longer message still learns of the mismatch promptly over `ofi`.
#[test]
fn ofi_mismatch_p2p_len_w2() {
    ofi_quick_with(2, "mismatch_p2p_len", &[]);
}

/// Over `ofi`, a length mismatch between two rendezvous transfers whose receiver asked the
/// writes to complete them: the sender's error immediate still reaches it.
#[test]
fn ofi_mismatch_rendezvous_len_w2() {
    ofi_quick_with(2, "mismatch_rendezvous_len", &[]);
}
