//! The raw (C ABI) entry points: `Communicator::check_raw` refuses what `enqueue_raw` would,
//! without queueing anything, and accepts what it runs.

mod common;

use ampccl::op::OpKind;
use ampccl::{DataType, Error, OpSpec, RawOp};
use common::spawn;

#[test]
fn check_raw_agrees_with_enqueue_raw() {
    spawn(2, |c| {
        let mut buf = vec![1.0f32; 8];
        let p = buf.as_mut_ptr().cast::<u8>();
        let spec = OpSpec::new(OpKind::AllReduce, 8, DataType::F32);
        let good = RawOp {
            spec,
            send: p,
            recv: p,
        };
        c.check_raw(&good).unwrap();
        let null = RawOp {
            send: std::ptr::null(),
            ..good
        };
        assert!(matches!(c.check_raw(&null), Err(Error::InvalidArgument(m)) if m.contains("null")));
        let bad_root = RawOp {
            spec: OpSpec::new(OpKind::Broadcast, 8, DataType::F32).root(2),
            ..good
        };
        assert!(
            matches!(c.check_raw(&bad_root), Err(Error::InvalidArgument(m)) if m.contains("root 2"))
        );
        // Nothing was queued by the checks: the real operation runs and is correct.
        // SAFETY: `buf` outlives the wait below.
        let ev = unsafe { c.enqueue_raw(c.default_stream(), &[good]).unwrap() };
        ev.wait().unwrap();
        assert!(buf.iter().all(|&x| x == 2.0));
    });
}

/// A raw operation that fails while nobody waits for it (the C ABI enqueues and looks at the
/// result later, or never) still fails the communicator: its peers are told at once, instead of
/// waiting out their own timeouts.
#[test]
fn an_unwatched_failure_tells_the_peers() {
    use ampccl::registry::Registry;
    use ampccl::{Communicator, UniqueId};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let id = UniqueId::generate().unwrap();
    // Rank 0 gives up on a peer after 1 s, rank 1 only after 30 s.
    let timeouts = [Duration::from_secs(1), Duration::from_secs(30)];
    // Rank 0 keeps its communicator (and its transport) until rank 1 is done: a peer that
    // goes away is noticed without being told.
    let done = Arc::new(std::sync::Barrier::new(2));
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let done = done.clone();
            let cfg = ampccl::Config {
                timeout: timeouts[r],
                ..common::test_config()
            };
            std::thread::spawn(move || {
                let c = Communicator::init_with(&id, r, 2, cfg, Registry::builtin()).unwrap();
                let mut buf = vec![0f32; 4];
                let t = Instant::now();
                let failed = if r == 0 {
                    // A receive nobody sends: queued and kicked (as the C ABI does), never
                    // waited for.
                    let spec = OpSpec::new(OpKind::Recv, 4, DataType::F32).root(1);
                    let p = buf.as_mut_ptr().cast::<u8>();
                    let op = RawOp {
                        spec,
                        send: p,
                        recv: p,
                    };
                    // SAFETY: `buf` outlives the communicator's engine (dropped below, after
                    // the barrier).
                    let _unwatched = unsafe { c.enqueue_raw(c.default_stream(), &[op]).unwrap() };
                    c.default_stream().kick();
                    while c.async_error().is_none() && t.elapsed() < Duration::from_secs(15) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    c.async_error()
                } else {
                    // Waits on rank 0, which never sends either.
                    c.recv(&mut buf, 0).err()
                };
                let waited = t.elapsed();
                done.wait();
                (failed, waited)
            })
        })
        .collect();
    let r: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(r[0].0.is_some(), "rank 0's receive did not fail: {r:?}");
    let (told, waited) = &r[1];
    assert!(told.is_some(), "rank 1's receive did not fail: {r:?}");
    assert!(
        *waited < Duration::from_secs(15),
        "rank 1 waited {waited:?} for a failure rank 0 met after 1 s: {told:?}"
    );
}
