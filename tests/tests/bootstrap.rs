//! Bootstrap faults across processes: a rank that never arrives, a rank that dies right after
//! the address table was exchanged, a dead rank whose sockets a child process keeps open, and
//! world sizes no rendezvous could hold.

use std::time::{Duration, Instant};

use ampccl::{Communicator, Error, UniqueId};
use ampccl_tests::{Launch, Outcome, ensure, rank_world, worker};
use ampccl_transport::bootstrap::{Bootstrap, MAX_RANKS, PROGRESS_LOG_EVERY};

/// How long a failure may take to surface once its cause happened.
const PROMPT: Duration = Duration::from_secs(5);

#[test]
fn worker_entry() {
    worker(|scenario| match scenario {
        "never_arrives" => never_arrives(),
        "dies_after_table" => dies_after_table(),
        "dead_but_socket_held" => dead_but_socket_held(),
        s => Err(format!("unknown scenario {s:?}")),
    });
}

fn unique_id() -> Result<UniqueId, String> {
    UniqueId::from_hex(&std::env::var("AMPCCL_UNIQUE_ID").unwrap_or_default())
        .map_err(|e| format!("bad AMPCCL_UNIQUE_ID: {e}"))
}

/// Launched without rank 1 (`AMPCCL_TIMEOUT_S=11`): init times out naming rank 1.
fn never_arrives() -> Outcome {
    let (rank, world) = rank_world();
    let t = Instant::now();
    let r = Communicator::init(&unique_id()?, rank, world);
    let el = t.elapsed();
    match r {
        Err(Error::Timeout(m)) if m.contains("1 of 2 ranks joined; missing rank 1") => {
            eprintln!("init: {m}");
            ensure(el < Duration::from_secs(11) + PROMPT, || {
                format!("timed out after {el:?}")
            })
        }
        Err(e) => Err(format!("init: wrong error {e:?}")),
        Ok(_) => Err("init succeeded without rank 1".into()),
    }
}

/// Rank 0 leaves right after the table exchange; the others must fail at once naming it,
/// although their timeout (`AMPCCL_TIMEOUT_S`, 60 s) is far away.
fn dies_after_table() -> Outcome {
    let (rank, world) = rank_world();
    let id = unique_id()?;
    if rank == 0 {
        Bootstrap::rendezvous_only(&id, rank, world, Duration::from_secs(30))
            .map_err(|e| format!("rendezvous: {e}"))?;
        // SAFETY: ends this process at once, as a crash would.
        unsafe { libc::_exit(0) };
    }
    let t = Instant::now();
    let r = Communicator::init(&id, rank, world);
    let el = t.elapsed();
    match r {
        Err(Error::Remote(m)) if m.contains("peer rank(s) 0 (pid") && m.contains("exited") => {
            eprintln!("init: {m}");
            ensure(el < PROMPT, || format!("noticed after {el:?}"))
        }
        Err(e) => Err(format!("init: wrong error {e:?}")),
        Ok(_) => Err("init succeeded without rank 0".into()),
    }
}

/// Rank 1 forks a child that inherits its bootstrap sockets, then exits: the connections stay
/// open, but rank 0's allgather must notice that rank 1's process is gone (a zombie here: the
/// launcher reaps in order) and fail at once naming it.
fn dead_but_socket_held() -> Outcome {
    let (rank, world) = rank_world();
    let bs = Bootstrap::init(&unique_id()?, rank, world, Duration::from_secs(60))
        .map_err(|e| format!("init: {e}"))?;
    bs.barrier(1).map_err(|e| format!("barrier: {e}"))?;
    if rank == 1 {
        // SAFETY: the child only calls async-signal-safe functions (close, sleep, _exit).
        unsafe {
            if libc::fork() == 0 {
                libc::close(1);
                libc::close(2);
                libc::sleep(15);
                libc::_exit(0);
            }
            libc::_exit(0);
        }
    }
    let t = Instant::now();
    let r = bs.allgather(2, b"still there?");
    let el = t.elapsed();
    match r {
        Err(Error::Remote(m)) if m.contains("peer rank 1") && m.contains("has exited") => {
            eprintln!("allgather: {m}");
            ensure(el < PROMPT, || format!("noticed after {el:?}"))
        }
        Err(e) => Err(format!("allgather: wrong error {e:?}")),
        Ok(_) => Err("allgather succeeded without rank 1".into()),
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_and_the_wait_is_logged() {
    assert_eq!(PROGRESS_LOG_EVERY, Duration::from_secs(10));
    let res = Launch::new(2, "never_arrives")
        .only_ranks(&[0])
        .env("AMPCCL_TIMEOUT_S", "11")
        .deadline(Duration::from_secs(40))
        .run();
    let log = &res[0].stderr;
    assert!(
        log.lines().any(|l| l.contains("waiting")
            && l.contains("for the bootstrap rendezvous")
            && l.contains("1 of 2 ranks joined; missing rank 1")),
        "no progress line in:\n{log}"
    );
}

#[test]
fn a_rank_dying_after_the_table_exchange_is_reported_at_once() {
    Launch::new(3, "dies_after_table")
        .may_die(0)
        .deadline(Duration::from_secs(40))
        .run();
}

#[test]
fn a_dead_rank_whose_socket_a_child_holds_is_reported_at_once() {
    Launch::new(2, "dead_but_socket_held")
        .may_die(1)
        .reap_in_order()
        .deadline(Duration::from_secs(40))
        .run();
}

#[test]
fn an_absurd_world_size_is_invalid_argument_before_connecting() {
    // An id whose root nobody serves: the call must fail before trying to reach it.
    let id = UniqueId::new(([127, 0, 0, 1], ampccl_tests::free_port()).into(), 1);
    for world in [i32::MAX as usize, MAX_RANKS + 1] {
        let t = Instant::now();
        match Communicator::init(&id, 0, world) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("world size"), "{m}"),
            Err(e) => panic!("world {world}: wrong error {e:?}"),
            Ok(_) => panic!("world {world}: init succeeded"),
        }
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
