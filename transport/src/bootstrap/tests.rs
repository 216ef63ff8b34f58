//! Thread-mode tests of the bootstrap: all ranks of a world run as threads of the test process
//! and talk over loopback TCP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::*;

const T: Duration = Duration::from_secs(20);

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind(localhost())
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `f` on every rank of a fresh world (one thread each) and returns the results by rank.
fn run_world<R: Send>(world: usize, f: impl Fn(Bootstrap) -> R + Sync) -> (Vec<R>, RootReport) {
    let (id, root) = UniqueId::generate_with(localhost(), T).unwrap();
    let out = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let f = &f;
                s.spawn(move || f(Bootstrap::init(&id, rank, world, T).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (out, root.join().unwrap())
}

fn payload(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + rank * 7) as u8).collect()
}

#[test]
fn handle_is_send_sync() {
    fn assert<T: Send + Sync>() {}
    assert::<Bootstrap>();
}

#[test]
fn worlds_1_to_4_collectives() {
    for world in 1..=4 {
        let (results, report) = run_world(world, |bs| {
            let (rank, world) = (bs.rank(), bs.world());
            assert_eq!(bs.local_rank(), rank);
            assert_eq!(bs.pids(), vec![std::process::id(); world]);
            assert!(bs.host_ids().iter().all(|&h| h == bs.host_id()));
            // Small (inline) and big (helper-thread) payloads of different sizes per rank.
            for (tag, base) in [(1, 10), (2, 300_000)] {
                let all = bs
                    .allgather(tag, &payload(rank, base + rank * 1001))
                    .unwrap();
                for (r, got) in all.iter().enumerate() {
                    assert_eq!(
                        *got,
                        payload(r, base + r * 1001),
                        "world {world} rank {rank} from {r}"
                    );
                }
            }
            bs.barrier(3).unwrap();
            let root = world - 1;
            let msg = b"from the root".to_vec();
            let data = (rank == root).then_some(&msg[..]);
            assert_eq!(bs.broadcast(4, root, data).unwrap(), msg);
            bs.barrier(5).unwrap();
            rank
        });
        assert_eq!(results, (0..world).collect::<Vec<_>>());
        assert_eq!(
            report,
            RootReport {
                served: world,
                refused: vec![],
                timed_out: false,
                missing: vec![],
            }
        );
    }
}

#[test]
fn tagged_messages_out_of_order_and_to_self() {
    run_world(2, |bs| {
        if bs.rank() == 0 {
            bs.send(1, 1, b"a").unwrap();
            bs.send(1, 2, b"b").unwrap();
            bs.send(1, 1, b"c").unwrap();
            bs.send(0, 9, b"self").unwrap();
            assert_eq!(bs.recv(0, 9).unwrap(), b"self");
        } else {
            assert_eq!(bs.recv(0, 2).unwrap(), b"b");
            assert_eq!(bs.recv(0, 1).unwrap(), b"a");
            assert_eq!(bs.recv(0, 1).unwrap(), b"c");
        }
        // Collectives and p2p with the same tag do not mix.
        bs.send(1 - bs.rank(), 7, b"p2p").unwrap();
        let all = bs.allgather(7, &[bs.rank() as u8]).unwrap();
        assert_eq!(all, vec![vec![0], vec![1]]);
        assert_eq!(bs.recv(1 - bs.rank(), 7).unwrap(), b"p2p");
        assert!(matches!(bs.send(2, 0, b""), Err(Error::InvalidArgument(_))));
    });
}

#[test]
fn concurrent_receivers_do_not_block_each_other() {
    run_world(2, |bs| {
        if bs.rank() == 0 {
            std::thread::scope(|s| {
                // Started first, so it likely becomes the reader; its message comes last.
                let a = s.spawn(|| bs.recv(1, 10).unwrap());
                std::thread::sleep(Duration::from_millis(50));
                let b = s.spawn(|| {
                    let m = bs.recv(1, 11).unwrap();
                    bs.send(1, 12, b"ack").unwrap();
                    m
                });
                assert_eq!(b.join().unwrap(), b"eleven");
                assert_eq!(a.join().unwrap(), b"ten");
            });
        } else {
            bs.send(0, 11, b"eleven").unwrap();
            assert_eq!(bs.recv(0, 12).unwrap(), b"ack");
            bs.send(0, 10, b"ten").unwrap();
        }
    });
}

#[test]
fn subgroup_and_parent_run_concurrently() {
    run_world(4, |bs| {
        let rank = bs.rank();
        let bad = |r: Result<Bootstrap>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(bad(bs.subgroup(&[rank, rank], 1)));
        assert!(bad(bs.subgroup(&[(rank + 1) % 4], 1)));
        assert!(bad(bs.subgroup(&[rank, 4], 1)));
        std::thread::scope(|s| {
            let parent = s.spawn(|| {
                for round in 0..20u8 {
                    let all = bs.allgather(5, &[b'p', rank as u8, round]).unwrap();
                    for (r, got) in all.iter().enumerate() {
                        assert_eq!(*got, [b'p', r as u8, round]);
                    }
                }
            });
            if rank == 1 || rank == 3 {
                let sub = bs.subgroup(&[1, 3], 77).unwrap();
                assert_eq!((sub.rank(), sub.world()), (rank / 2, 2));
                assert_eq!(sub.members(), [1, 3]);
                assert_eq!(sub.pids().len(), 2);
                for round in 0..20u8 {
                    // Same tag as the parent's allgather: the namespaces must keep them apart.
                    let all = sub
                        .allgather(5, &[b's', sub.rank() as u8, round, 0])
                        .unwrap();
                    assert_eq!(all, vec![vec![b's', 0, round, 0], vec![b's', 1, round, 0]]);
                }
                let nested = sub.subgroup(&[sub.rank()], 3).unwrap();
                assert_eq!(nested.members(), [rank]);
                assert_eq!(
                    nested.allgather(5, b"alone").unwrap(),
                    vec![b"alone".to_vec()]
                );
                let peer = 1 - sub.rank();
                sub.send(peer, 5, b"sub p2p").unwrap();
                assert_eq!(sub.recv(peer, 5).unwrap(), b"sub p2p");
                sub.barrier(0).unwrap();
            }
            parent.join().unwrap();
        });
        bs.barrier(6).unwrap();
    });
}

#[test]
fn wrong_token_and_garbage_are_refused_root_keeps_serving() {
    let (id, root) = UniqueId::generate_with(localhost(), T).unwrap();
    let addr = id.root_addr().unwrap();
    let wrong = UniqueId::new(addr, id.token() ^ 1);
    let err = Bootstrap::init(&wrong, 0, 2, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidUsage(m) if m.contains("wrong token")),
        "{err}"
    );
    // A full-size garbage hello: closed by the root.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&[0xAB; 80]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        raw.read(&mut [0u8; 16]).unwrap(),
        0,
        "root must close a malformed connection"
    );
    // A truncated one.
    TcpStream::connect(addr)
        .unwrap()
        .write_all(b"AMPC")
        .unwrap();
    // Inconsistent world and duplicate rank are refused with a reason.
    std::thread::scope(|s| {
        let r0 = s.spawn(|| Bootstrap::init(&id, 0, 2, T).unwrap());
        std::thread::sleep(Duration::from_millis(300));
        let e = Bootstrap::init(&id, 1, 3, T).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUsage(m) if m.contains("world")),
            "{e}"
        );
        let e = Bootstrap::init(&id, 0, 2, T).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUsage(m) if m.contains("duplicate")),
            "{e}"
        );
        let r1 = Bootstrap::init(&id, 1, 2, T).unwrap();
        let r0 = r0.join().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| r0.barrier(1).unwrap());
            r1.barrier(1).unwrap();
        });
    });
    let report = root.join().unwrap();
    assert_eq!(report.served, 2);
    let refused = report.refused.join("\n");
    assert_eq!(report.refused.len(), 5, "{refused}");
    for why in [
        "wrong token",
        "bad magic",
        "reading hello",
        "world",
        "duplicate rank",
    ] {
        assert!(refused.contains(why), "{why} missing in:\n{refused}");
    }
}

#[test]
fn missing_peer_times_out_and_root_exits() {
    let (id, root) = UniqueId::generate_with(localhost(), Duration::from_secs(2)).unwrap();
    let start = Instant::now();
    let err = Bootstrap::init(&id, 0, 2, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert!(
        start.elapsed() < Duration::from_millis(1900),
        "{:?}",
        start.elapsed()
    );
    let report = root.join().unwrap();
    assert!(report.timed_out && report.served == 0);
    assert!(start.elapsed() < Duration::from_secs(5));
    // Nobody listening at all.
    let nowhere = UniqueId::new(
        SocketAddr::new("127.0.0.1".parse().unwrap(), free_port()),
        1,
    );
    let err = Bootstrap::init(&nowhere, 0, 1, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
}

#[test]
fn bad_rank_or_world_is_invalid_argument() {
    let id = UniqueId::new("127.0.0.1:1".parse().unwrap(), 1);
    for (rank, world) in [(2, 2), (0, 0), (5, 1)] {
        let err = Bootstrap::init(&id, rank, world, T).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
}

#[test]
fn recv_times_out_and_dropped_peer_is_remote() {
    let (id, _root) = UniqueId::generate_with(localhost(), T).unwrap();
    let timeout = Duration::from_millis(500);
    let ready = Arc::new(Barrier::new(2));
    std::thread::scope(|s| {
        let r = ready.clone();
        s.spawn(move || {
            let bs = Bootstrap::init(&id, 0, 2, T).unwrap();
            r.wait(); // peer has tested its timeout
            std::thread::sleep(Duration::from_millis(100));
            drop(bs);
        });
        let bs = Bootstrap::init(&id, 1, 2, T).unwrap();
        let short = Bootstrap {
            timeout,
            ..bs.clone()
        };
        let start = Instant::now();
        let err = short.recv(0, 1).unwrap_err();
        assert!(
            matches!(&err, Error::Timeout(m) if m.contains("peer rank 0")),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(2));
        ready.wait();
        let err = bs.recv(0, 1).unwrap_err();
        assert!(
            matches!(&err, Error::Remote(m) if m.contains("peer rank 0")),
            "{err}"
        );
        // Other waiters see the closed link too.
        assert!(matches!(bs.allgather(2, b"x"), Err(Error::Remote(_))));
    });
}

#[test]
fn oversized_frame_is_malformed() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let link = link::Link::remote(listener.accept().unwrap().0, None).unwrap();
    let mut head = Vec::new();
    head.extend_from_slice(&0u64.to_le_bytes());
    head.extend_from_slice(&1u64.to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    head.extend_from_slice(&0xB007_F4A3u32.to_le_bytes());
    head.extend_from_slice(&((1u64 << 30) + 1).to_le_bytes());
    raw.write_all(&head).unwrap();
    let key = link::Key {
        space: 0,
        kind: link::KIND_P2P,
        tag: 1,
    };
    let err = link
        .recv(key, Instant::now() + T, &|| "peer rank 5".into())
        .unwrap_err();
    assert!(
        matches!(&err, Error::Remote(m) if m.contains("malformed") && m.contains("peer rank 5")),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Sizes from the wire, hostile and silent connections
// ---------------------------------------------------------------------------------------------

/// An 80-byte hello as a rank would send it.
fn raw_hello(token: Token, rank: u64, world: u64) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(b"AMPCHELO");
    h.extend_from_slice(&token.to_le_bytes());
    h.extend_from_slice(&rank.to_le_bytes());
    h.extend_from_slice(&world.to_le_bytes());
    h.extend_from_slice(&unique_id::encode_addr("127.0.0.1:1".parse().unwrap()));
    h.extend_from_slice(&[0; 16]);
    assert_eq!(h.len(), root::HELLO_BYTES);
    h
}

/// Sends `hello` to the root at `addr` and returns its status-1 reason.
fn refusal_of(addr: SocketAddr, hello: &[u8]) -> String {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(hello).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    let mut head = [0u8; 24];
    raw.read_exact(&mut head).unwrap();
    assert_eq!(&head[..8], b"AMPCTABL");
    assert_eq!(u64::from_le_bytes(head[8..16].try_into().unwrap()), 1);
    let mut why = String::new();
    raw.read_to_string(&mut why).unwrap();
    why
}

#[test]
fn absurd_world_size_is_invalid_argument_before_connecting() {
    // A root that must never hear from these ranks.
    let listener = TcpListener::bind(localhost()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let id = UniqueId::new(listener.local_addr().unwrap(), 1);
    for world in [MAX_RANKS + 1, i32::MAX as usize, usize::MAX] {
        let err = Bootstrap::init(&id, 0, world, T).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("world size")
                && m.contains(&MAX_RANKS.to_string())),
            "{err}"
        );
    }
    assert!(listener.accept().is_err(), "a rank connected anyway");
}

#[test]
fn root_survives_hostile_hellos_and_sizes_nothing_by_them() {
    let (id, root) = UniqueId::generate_with(localhost(), T).unwrap();
    let addr = id.root_addr().unwrap();
    let token = id.token();
    // The first hello to arrive fixes the world size: an absurd one must not size the table.
    for (rank, world, what) in [
        (0, 1u64 << 31, "out of range"),
        (0, u64::MAX, "out of range"),
        (0, MAX_RANKS as u64 + 1, "out of range"),
        (0, 0, "out of range"),
        (u64::MAX, 2, "not in a world of 2"),
    ] {
        let why = refusal_of(addr, &raw_hello(token, rank, world));
        assert!(why.contains(what), "rank {rank} world {world}: {why}");
    }
    // Without the token nothing is even checked.
    let why = refusal_of(addr, &raw_hello(token ^ 1, 0, 1 << 40));
    assert!(why.contains("wrong token"), "{why}");
    let (ranks, report) = {
        let out: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || Bootstrap::init(&id, r, 2, T).unwrap().rank()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (out, root.join().unwrap())
    };
    assert_eq!(ranks, [0, 1]);
    assert_eq!(report.served, 2);
    assert_eq!(report.refused.len(), 6, "{:?}", report.refused);
}

/// Threads of this process whose name starts with `prefix` (the kernel keeps 15 bytes).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn connection_flood_costs_no_thread_and_does_not_stop_the_rendezvous() {
    let (id, root) = UniqueId::generate_with(localhost(), T).unwrap();
    let addr = id.root_addr().unwrap();
    let flood: Vec<TcpStream> = (0..2 * root::MAX_PENDING_HELLOS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // One reader for every connection would be hundreds of threads; other tests running at the
    // same time have a few bootstrap threads of their own.
    let threads = threads_named("ampccl-bootstr");
    assert!(
        threads < 40,
        "{threads} bootstrap threads for {} connections",
        flood.len()
    );
    let start = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| s.spawn(move || Bootstrap::init(&id, r, 2, T).unwrap()))
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    drop(flood);
    let report = root.join().unwrap();
    assert_eq!(report.served, 2);
    assert!(
        report
            .refused
            .iter()
            .any(|r| r.contains("newer connections")),
        "{:?}",
        report.refused
    );
}

#[test]
fn frame_buffer_follows_the_bytes_not_the_claimed_length() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let link = link::Link::remote(listener.accept().unwrap().0, None).unwrap();
    let key = link::Key {
        space: 0,
        kind: link::KIND_P2P,
        tag: 1,
    };
    let frame_head = |len: u64| {
        let mut head = Vec::new();
        head.extend_from_slice(&0u64.to_le_bytes());
        head.extend_from_slice(&1u64.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        head.extend_from_slice(&0xB007_F4A3u32.to_le_bytes());
        head.extend_from_slice(&len.to_le_bytes());
        head
    };
    // A header claiming the largest allowed payload, then 100 bytes of it.
    raw.write_all(&frame_head(1 << 30)).unwrap();
    raw.write_all(&[7; 100]).unwrap();
    let err = link
        .recv(key, Instant::now() + Duration::from_millis(300), &|| {
            "peer rank 1".into()
        })
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    let held = link.receive_buffer_bytes();
    assert!(
        held > 0 && held <= 1 << 20,
        "{held} bytes held for 100 received"
    );
    // A fresh link: a big frame arriving in pieces is reassembled whole.
    let listener = TcpListener::bind(localhost()).unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let link = link::Link::remote(listener.accept().unwrap().0, None).unwrap();
    let body = payload(3, 3 << 20);
    let sender = std::thread::spawn({
        let body = body.clone();
        move || {
            raw.write_all(&frame_head(body.len() as u64)).unwrap();
            for chunk in body.chunks(100_000) {
                raw.write_all(chunk).unwrap();
            }
            raw
        }
    });
    let got = link
        .recv(key, Instant::now() + T, &|| "peer rank 1".into())
        .unwrap();
    assert!(got == body, "reassembled frame differs");
    sender.join().unwrap();
}

/// A relay in front of the root: on each rank's hello it opens `silent` connections to that
/// rank's mesh listener (and leaves them silent), then forwards the hello and relays the reply.
fn silent_relay(root: SocketAddr, ranks: usize, silent: usize) -> SocketAddr {
    let relay = TcpListener::bind(localhost()).unwrap();
    let addr = relay.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut strays = Vec::new();
        for _ in 0..ranks {
            let (mut rank_side, _) = relay.accept().unwrap();
            let mut hello = [0u8; root::HELLO_BYTES];
            rank_side.read_exact(&mut hello).unwrap();
            let listen = unique_id::decode_addr(&hello[40..64]).unwrap();
            strays.extend((0..silent).map(|_| TcpStream::connect(listen).unwrap()));
            let mut root_side = TcpStream::connect(root).unwrap();
            root_side.write_all(&hello).unwrap();
            std::thread::spawn(move || std::io::copy(&mut root_side, &mut rank_side));
        }
        std::thread::sleep(T);
        drop(strays);
    });
    addr
}

#[test]
fn silent_connections_to_root_and_mesh_listeners_do_not_stall_init() {
    let world = 3;
    let (id, root) = UniqueId::generate_with(localhost(), T).unwrap();
    let strays: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(id.root_addr().unwrap()).unwrap())
        .collect();
    let relayed = UniqueId::new(silent_relay(id.root_addr().unwrap(), world, 10), id.token());
    let start = Instant::now();
    let ranks: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                s.spawn(move || {
                    let bs = Bootstrap::init(&relayed, r, world, T).unwrap();
                    bs.barrier(1).unwrap();
                    bs.rank()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = start.elapsed();
    assert_eq!(ranks, [0, 1, 2]);
    assert!(took < Duration::from_secs(3), "init took {took:?}");
    drop(strays);
    assert_eq!(root.join().unwrap().served, world);
}

// ---------------------------------------------------------------------------------------------
// Missing and dead ranks during init
// ---------------------------------------------------------------------------------------------

/// Runs `init` for `ranks` of `world` (the others never arrive), each with `timeout`; returns
/// each error and how long it took.
fn init_without_some(
    id: UniqueId,
    world: usize,
    ranks: &[usize],
    timeout: Duration,
) -> Vec<(Error, Duration)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|&r| {
                s.spawn(move || {
                    let t = Instant::now();
                    let e = Bootstrap::init(&id, r, world, timeout).unwrap_err();
                    (e, t.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_rank_that_never_arrives_is_named_in_the_timeout() {
    let (id, _root) = UniqueId::generate_with(localhost(), T).unwrap();
    for (e, took) in init_without_some(id, 4, &[0, 2], Duration::from_millis(1500)) {
        assert!(
            matches!(&e, Error::Timeout(m) if m.contains("2 of 4 ranks joined")
                && m.contains("missing ranks 1, 3")),
            "{e}"
        );
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
}

#[test]
fn a_root_that_gives_up_names_the_missing_ranks() {
    let (id, root) = UniqueId::generate_with(localhost(), Duration::from_secs(1)).unwrap();
    let errs = init_without_some(id, 5, &[0, 1, 4], T);
    for (e, took) in errs {
        assert!(
            matches!(&e, Error::Timeout(m) if m.contains("gave up")
                && m.contains("3 of 5 ranks joined; missing ranks 2, 3")),
            "{e}"
        );
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    let report = root.join().unwrap();
    assert!(report.timed_out);
    assert_eq!(report.missing, [2, 3]);
}

/// Collects the messages of the events logged on the threads it is the default of.
struct Capture(Arc<std::sync::Mutex<Vec<String>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        self.0.lock().unwrap().push(m.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_waiting_rank_logs_who_joined_and_who_is_missing() {
    let (id, _root) = UniqueId::generate_with(localhost(), T).unwrap();
    let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        // Rank 2 joins, then waits (longer than rank 0) for rank 1, which never comes.
        s.spawn(|| Bootstrap::init(&id, 2, 3, Duration::from_secs(3)).unwrap_err());
        let logs = logs.clone();
        s.spawn(move || {
            tracing::subscriber::with_default(Capture(logs), || {
                TEST_LOG_EVERY.set(Some(Duration::from_millis(400)));
                Bootstrap::init(&id, 0, 3, Duration::from_millis(1500)).unwrap_err()
            })
        });
    });
    let logs = logs.lock().unwrap();
    let lines: Vec<&String> = logs.iter().filter(|l| l.contains("waiting")).collect();
    assert!(
        (2..=4).contains(&lines.len()),
        "expected a line every 400 ms for 1.5 s: {logs:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("2 of 3 ranks joined; missing rank 1")),
        "{logs:?}"
    );
}

/// The pid of a process that has exited (and been reaped).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn mesh_fails_at_once_when_a_local_peer_died() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let addrs = [
        SocketAddr::new("127.0.0.1".parse().unwrap(), free_port()),
        listener.local_addr().unwrap(),
    ];
    let dead = dead_pid();
    let watch = [Some(dead), None];
    let peers = mesh::Peers {
        rank: 1,
        world: 2,
        token: 7,
        addrs: &addrs,
        watch: &watch,
    };
    let start = Instant::now();
    let err = mesh::build(listener, &peers, Instant::now() + T).unwrap_err();
    assert!(
        matches!(&err, Error::Remote(m) if m.contains(&format!("peer rank(s) 0 (pid {dead}) exited"))),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn link_to_a_dead_local_peer_fails_at_once_even_with_the_socket_open() {
    let listener = TcpListener::bind(localhost()).unwrap();
    // The other end stays open, as if a child of the dead peer had inherited it.
    let _held = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let dead = dead_pid();
    let link = link::Link::remote(listener.accept().unwrap().0, Some(dead)).unwrap();
    let key = link::Key {
        space: 0,
        kind: link::KIND_ALLGATHER,
        tag: 1,
    };
    let who = || "peer rank 1".to_string();
    let start = Instant::now();
    let err = link.recv(key, Instant::now() + T, &who).unwrap_err();
    assert!(
        matches!(&err, Error::Remote(m) if m.contains("peer rank 1")
            && m.contains(&format!("pid {dead}"))),
        "{err}"
    );
    // A send that fills the socket buffers does not wait for the timeout either.
    let err = link
        .send(key, &vec![0u8; 64 << 20], Instant::now() + T, &who)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Remote(m) if m.contains(&format!("pid {dead}"))),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}
