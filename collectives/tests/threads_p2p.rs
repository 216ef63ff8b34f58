//! Thread-mode tests of the rooted and point-to-point operations: Broadcast (chain), Reduce
//! (chain), Send/Recv (chunked through the CCL buffer, groups, sends to oneself) and Barrier,
//! on 1..=4 ranks, several dtypes, with and without cross-memory attach, plus mismatches that
//! must fail on every rank instead of hanging.

mod common;

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ampccl::{Communicator, Config, Element, Error, ReduceOp, bf16};
use common::{spawn_with, test_config};

/// Larger than the 64 KiB CCL buffer for every dtype tested (several chunks).
const BIG: usize = 70_001;
const COUNTS: [usize; 4] = [0, 1, 1021, BIG];

fn cfg(cma: bool) -> Config {
    Config {
        allow_cma: cma,
        ..test_config()
    }
}

/// Element types built from small integers, exactly representable (bf16: up to 256).
trait Val: Element + PartialEq + Debug + Copy + Send + Sync + 'static {
    fn of(v: i64) -> Self;
}
impl Val for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
}
impl Val for i64 {
    fn of(v: i64) -> Self {
        v
    }
}
impl Val for u8 {
    fn of(v: i64) -> Self {
        v as u8
    }
}
impl Val for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
}

/// Runs `$f::<T>` for every tested dtype.
macro_rules! each_dtype {
    ($f:ident ( $($a:expr),* )) => {{
        $f::<f32>($($a),*);
        $f::<i64>($($a),*);
        $f::<u8>($($a),*);
        $f::<bf16>($($a),*);
    }};
}

fn pattern<T: Val>(seed: usize, count: usize) -> Vec<T> {
    (0..count)
        .map(|i| T::of(((i * 7 + seed * 13) % 101) as i64))
        .collect()
}

fn check_broadcast<T: Val>(c: &Communicator, cma: bool) {
    let (me, world) = (c.rank(), c.world());
    // With it allowed, whether the kernel permits cross-memory attach decides.
    assert!(cma || !c.uses_cross_memory_attach());
    for count in COUNTS {
        for root in 0..world {
            let want = pattern::<T>(root + 1, count);
            // Out of place; non-roots pass no input.
            let send = if me == root { want.clone() } else { Vec::new() };
            let mut out = vec![T::of(1); count];
            c.broadcast_from(&send, &mut out, root).unwrap();
            assert!(
                out == want,
                "broadcast_from world {world} cma {cma} root {root} count {count} rank {me}"
            );
            // In place.
            let mut buf = if me == root {
                want.clone()
            } else {
                vec![T::of(3); count]
            };
            c.broadcast(&mut buf, root).unwrap();
            assert!(
                buf == want,
                "broadcast world {world} cma {cma} root {root} count {count} rank {me}"
            );
        }
    }
}

#[test]
fn broadcast_every_root() {
    for cma in [true, false] {
        for world in 1..=4 {
            spawn_with(world, cfg(cma), move |c| {
                each_dtype!(check_broadcast(&c, cma))
            });
        }
    }
}

/// Rank `r`'s element `i` for `op` on `world` ranks: small enough that every partial result is
/// exact in bf16 and u8, and (for Avg) the sum divides by the world size.
fn reduce_input(op: ReduceOp, world: usize, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Prod => 1 + ((i + r) % 3) as i64,
        _ => (i % 20) as i64 + (world * r) as i64,
    }
}

fn reduce_expect(op: ReduceOp, world: usize, i: usize) -> i64 {
    let v = (0..world).map(|r| reduce_input(op, world, r, i));
    match op {
        ReduceOp::Sum => v.sum(),
        ReduceOp::Prod => v.product(),
        ReduceOp::Max => v.max().unwrap(),
        ReduceOp::Min => v.min().unwrap(),
        ReduceOp::Avg => v.sum::<i64>() / world as i64,
    }
}

fn check_reduce<T: Val>(c: &Communicator, cma: bool) {
    let (me, world) = (c.rank(), c.world());
    for count in [0, 1, 1021, BIG] {
        for op in ReduceOp::ALL {
            let input: Vec<T> = (0..count)
                .map(|i| T::of(reduce_input(op, world, me, i)))
                .collect();
            let want: Vec<T> = (0..count)
                .map(|i| T::of(reduce_expect(op, world, i)))
                .collect();
            for root in 0..world {
                let what = format!("{op:?} world {world} cma {cma} root {root} count {count}");
                // Out of place; non-roots pass no output.
                let mut out = if me == root {
                    vec![T::of(5); count]
                } else {
                    Vec::new()
                };
                c.reduce(&input, &mut out, op, root).unwrap();
                if me == root {
                    assert!(out == want, "reduce {what}");
                }
                // In place: non-roots keep their buffer.
                let mut buf = input.clone();
                c.reduce_in_place(&mut buf, op, root).unwrap();
                let keep = if me == root { &want } else { &input };
                assert!(buf == *keep, "reduce_in_place {what} rank {me}");
            }
        }
    }
}

#[test]
fn reduce_every_root_every_op() {
    for cma in [true, false] {
        for world in 1..=4 {
            spawn_with(world, cfg(cma), move |c| each_dtype!(check_reduce(&c, cma)));
        }
    }
}

fn check_send_recv<T: Val>(c: &Communicator, cma: bool) {
    let (me, world) = (c.rank(), c.world());
    for count in COUNTS {
        for src in 0..world {
            for dst in (0..world).filter(|&d| d != src) {
                let data = pattern::<T>(src * 5 + dst, count);
                if me == src {
                    c.send(&data, dst).unwrap();
                } else if me == dst {
                    let mut got = vec![T::of(9); count];
                    c.recv(&mut got, src).unwrap();
                    assert!(
                        got == data,
                        "{src} -> {dst} world {world} cma {cma} count {count}"
                    );
                }
            }
        }
    }
}

#[test]
fn send_recv_pairs() {
    for cma in [true, false] {
        for world in 2..=4 {
            spawn_with(world, cfg(cma), move |c| {
                each_dtype!(check_send_recv(&c, cma))
            });
        }
    }
}

#[test]
fn send_recv_agree_on_bytes_not_dtype() {
    spawn_with(2, test_config(), |c| {
        let v: Vec<u32> = (0..40_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        if c.rank() == 0 {
            c.send(&v, 1).unwrap();
        } else {
            let mut got = vec![0u8; v.len() * 4];
            c.recv(&mut got, 0).unwrap();
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
            assert!(got == bytes);
        }
    });
}

#[test]
fn group_ring_exchange() {
    for cma in [true, false] {
        for world in 1..=4 {
            spawn_with(world, cfg(cma), move |c| {
                let (me, w) = (c.rank(), c.world());
                let (next, prev) = ((me + 1) % w, (me + w - 1) % w);
                for count in [0, 1, BIG] {
                    let send = pattern::<f32>(me, count);
                    let mut got = vec![0f32; count];
                    // Blocking send-then-recv would wait for the next rank's receive forever.
                    c.group(|g| {
                        g.send(&send, next)?;
                        g.recv(&mut got, prev)
                    })
                    .unwrap();
                    assert!(
                        got == pattern::<f32>(prev, count),
                        "world {w} cma {cma} count {count} rank {me}"
                    );
                }
            });
        }
    }
}

#[test]
fn group_receives_from_several_peers() {
    // Every rank receives from all others in one group: the receives share the CCL buffer.
    for cma in [true, false] {
        spawn_with(4, cfg(cma), move |c| {
            let (me, w) = (c.rank(), c.world());
            let send: Vec<Vec<i64>> = (0..w).map(|d| pattern(me * 4 + d, BIG)).collect();
            let mut got: Vec<Vec<i64>> = (0..w).map(|_| vec![0; BIG]).collect();
            c.group(|g| {
                for (peer, buf) in got.iter_mut().enumerate() {
                    if peer != me {
                        g.recv(buf, peer)?;
                    }
                }
                for (peer, buf) in send.iter().enumerate() {
                    if peer != me {
                        g.send(buf, peer)?;
                    }
                }
                Ok(())
            })
            .unwrap();
            for (peer, buf) in got.iter().enumerate() {
                if peer != me {
                    assert!(*buf == pattern::<i64>(peer * 4 + me, BIG), "cma {cma}");
                }
            }
        });
    }
}

#[test]
fn group_several_messages_to_one_peer() {
    // Matched in issue order; the group's members run on different streams.
    for cma in [true, false] {
        spawn_with(2, cfg(cma), move |c| {
            let sizes = [BIG, 1, 0, 3 * BIG];
            let data: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| pattern(k, n))
                .collect();
            let mut got: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
            for _ in 0..5 {
                if c.rank() == 0 {
                    c.group(|g| data.iter().try_for_each(|d| g.send(d, 1)))
                        .unwrap();
                } else {
                    c.group(|g| got.iter_mut().try_for_each(|b| g.recv(b, 0)))
                        .unwrap();
                    assert!(got == data, "cma {cma}");
                }
            }
        });
    }
}

#[test]
fn self_send_recv_in_group() {
    for world in 1..=3 {
        spawn_with(world, test_config(), |c| {
            let me = c.rank();
            let a = pattern::<i64>(1, BIG);
            let b = pattern::<i64>(2, 10);
            let (mut ga, mut gb) = (vec![0i64; BIG], vec![0i64; 10]);
            // The n-th send to oneself matches the n-th receive from oneself.
            c.group(|g| {
                g.recv(&mut ga, me)?;
                g.send(&a, me)?;
                g.send(&b, me)?;
                g.recv(&mut gb, me)
            })
            .unwrap();
            assert!(ga == a && gb == b);
            // Sizes must match.
            let mut small = vec![0i64; 9];
            let e = c
                .group(|g| {
                    g.send(&b, me)?;
                    g.recv(&mut small, me)
                })
                .unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            // A lone send to oneself, in a group or not, is refused.
            let e = c.send(&b, me).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let e = c.group(|g| g.send(&b, me)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let e = c.recv(&mut small, me).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            // None of that broke the communicator.
            c.barrier().unwrap();
            let mut one = [me as i64];
            c.broadcast(&mut one, 0).unwrap();
            assert_eq!(one, [0]);
        });
    }
}

#[test]
fn barrier_back_to_back() {
    for cma in [true, false] {
        for world in 1..=4 {
            let entered = Arc::new(AtomicUsize::new(0));
            spawn_with(world, cfg(cma), move |c| {
                for i in 0..100 {
                    entered.fetch_add(1, Ordering::SeqCst);
                    c.barrier().unwrap();
                    // Nobody leaves barrier i before everybody entered it.
                    let n = entered.load(Ordering::SeqCst);
                    assert!(n >= world * (i + 1), "barrier {i}: only {n} entries");
                }
            });
        }
    }
}

#[test]
fn barrier_between_sends() {
    // Barriers (the links' ack counters) interleaved with sends and receives on the same links.
    spawn_with(3, test_config(), |c| {
        let me = c.rank();
        for round in 0..20 {
            let v = pattern::<u8>(round, 1 + round * 5000);
            if me == 0 {
                c.send(&v, 1).unwrap();
            } else if me == 1 {
                let mut got = vec![0u8; v.len()];
                c.recv(&mut got, 0).unwrap();
                assert!(got == v);
            }
            c.barrier().unwrap();
        }
    });
}

fn timeout_cfg(cma: bool) -> Config {
    Config {
        timeout: Duration::from_secs(10),
        ..cfg(cma)
    }
}

/// Runs `op` (rank 0 sends, rank 1 receives a mismatched message), then a barrier, and checks
/// the errors: the receiver fails on the call itself; the sender fails on it or, when the
/// message went eagerly (a sender completes once it has written, as MPI's eager sends), on its
/// next operation — never a hang or a silent success of both.
fn check_sender_receiver_mismatch(op: fn(&Communicator) -> ampccl::Result<()>, large: bool) {
    for cma in [true, false] {
        let t = Instant::now();
        let r = spawn_with(2, timeout_cfg(cma), move |c| {
            let first = op(&c);
            let next = if first.is_ok() { c.barrier() } else { Ok(()) };
            (first, next)
        });
        assert!(r[1].0.is_err(), "receiver, cma {cma}: {:?}", r[1]);
        if large {
            assert!(
                r[0].0.is_err(),
                "sender of a large message, cma {cma}: {:?}",
                r[0]
            );
        } else {
            assert!(
                r[0].0.is_err() || r[0].1.is_err(),
                "sender, cma {cma}: {:?}",
                r[0]
            );
        }
        assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    }
}

#[test]
fn broadcast_count_mismatch_fails_everywhere() {
    // 40 bytes go eagerly, 400 kB through the receiver's clear-to-send.
    check_sender_receiver_mismatch(|c| c.broadcast(&mut vec![1f32; 10 + c.rank()], 0), false);
    check_sender_receiver_mismatch(
        |c| c.broadcast(&mut vec![1f32; 100_000 + c.rank()], 0),
        true,
    );
}

#[test]
fn send_recv_zero_vs_nonzero_fails_everywhere() {
    check_sender_receiver_mismatch(
        |c| {
            if c.rank() == 0 {
                c.send::<f32>(&[], 1)
            } else {
                c.recv(&mut [0f32; 5], 0)
            }
        },
        false,
    );
}
