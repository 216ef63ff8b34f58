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
                timed_out: false
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
    assert!(matches!(err, Error::Remote(_)), "{err}");
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
    let link = link::Link::remote(listener.accept().unwrap().0).unwrap();
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
