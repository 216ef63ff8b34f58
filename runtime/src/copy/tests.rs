//! Exactness of every copy at any alignment; the store-kind learner's decisions.

use super::learner::{PLAIN, Pick, STREAMING, SizeClass};
use super::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs `f` (a copy) at every offset of source and destination within a cache line and at
/// lengths around the thresholds and vector boundaries: the copy must be exact and write
/// nothing outside.
fn check_exact(name: &str, f: &dyn Fn(*mut u8, *const u8, usize)) {
    let (stream_min, vector_min) = (STREAM_MIN.bytes(), VECTOR_MIN.bytes());
    let max = stream_min + 300;
    let src: Vec<u8> = (0..max + 64).map(|i| (i * 7 + 3) as u8).collect();
    for len in [
        0,
        1,
        31,
        32,
        127,
        129,
        vector_min - 1,
        vector_min,
        vector_min + 33,
        learner::MIN_BYTES.bytes() + 65,
        STREAM_OUT_MIN.bytes() + 1,
        stream_min - 1,
        stream_min,
        stream_min + 33,
        max,
    ] {
        for (so, dof) in [(0, 0), (1, 0), (0, 5), (17, 31), (63, 1)] {
            let mut dst = vec![0xEEu8; max + 128];
            f(dst[dof..].as_mut_ptr(), src[so..].as_ptr(), len);
            assert_eq!(
                &dst[dof..dof + len],
                &src[so..so + len],
                "{name}: len {len} at {so}/{dof}"
            );
            assert!(
                dst[..dof].iter().all(|&b| b == 0xEE),
                "{name}: before, {len}"
            );
            assert!(
                dst[dof + len..].iter().all(|&b| b == 0xEE),
                "{name}: after, {len}"
            );
        }
    }
}

#[test]
fn every_copy_is_exact_at_any_alignment() {
    // SAFETY (all closures): `check_exact` passes ranges inside two disjoint vectors.
    check_exact("copy", &|d, s, n| unsafe { copy(d, s, n) });
    check_exact("copy_out", &|d, s, n| unsafe { copy_out(d, s, n) });
    for kind in [PLAIN, STREAMING] {
        // Make `kind` the cheaper one; exploring copies take the other: both run.
        let shared = SharedCopy::default();
        for class in &shared.stores.classes {
            class.cost[kind].store(1, Ordering::Relaxed);
            class.cost[1 - kind].store(1000, Ordering::Relaxed);
        }
        check_exact("SharedCopy", &|d, s, n| unsafe { shared.copy(d, s, n) });
    }
}

/// A tee writes both destinations exactly, whatever each one's store kind, also where the
/// two are aligned differently.
#[test]
fn a_tee_is_exact_into_both_destinations() {
    use CopyTo::{Local, Output, Peer};
    for (first, second) in [(Local, Output), (Output, Peer), (Peer, Local)] {
        for shift in [0, 1, 33] {
            check_exact("tee", &|d, s, n| {
                let mut other = vec![0u8; n + shift];
                // SAFETY: `d`, `s` as `check_exact` passes them; `other` holds `n` bytes
                // from `shift` and is disjoint from both.
                unsafe { tee([(d, first), (other[shift..].as_mut_ptr(), second)], s, n) };
                // SAFETY: `s` is valid for `n` reads.
                let src = unsafe { std::slice::from_raw_parts(s, n) };
                assert!(
                    other[shift..] == *src,
                    "tee's second destination, {n} bytes"
                );
            });
        }
    }
}

const MIB: usize = 1 << 20;
/// A write of the choice, `kind`.
const fn serving(kind: usize) -> Pick {
    Pick {
        kind,
        trying: false,
    }
}
/// A try of `kind`, which is not the choice.
const fn trying(kind: usize) -> Pick {
    Pick { kind, trying: true }
}

/// Plain stores first, streaming ones on the next copy, then the cheaper kind, the other
/// one once per exploration period while the two are close.
#[test]
fn a_size_class_takes_the_cheaper_kind_and_keeps_trying_the_other() {
    let c = SizeClass::new(1);
    let period = StoreChoice::EXPLORE_PERIOD.as_nanos() as u64;
    assert_eq!(c.pick(0), serving(PLAIN));
    c.record(serving(PLAIN), MIB, Duration::from_micros(30));
    assert_eq!(c.pick(1), trying(STREAMING));
    // Dearer, but within `LOSS` times plain: tried again after the shortest wait.
    c.record(trying(STREAMING), MIB, Duration::from_micros(55));
    assert_eq!(
        (c.pick(2), c.pick(period / 2)),
        (serving(PLAIN), serving(PLAIN))
    );
    assert_eq!(
        (c.pick(period + 1), c.pick(period + 2)),
        (trying(STREAMING), serving(PLAIN))
    );
    c.record(trying(STREAMING), MIB, Duration::from_micros(55));
    // The plain stores turn slow (the host moved the cores apart): two slow copies make
    // streaming the choice ...
    c.record(serving(PLAIN), MIB, Duration::from_micros(400));
    assert_eq!(c.pick(period + 3), serving(PLAIN));
    c.record(serving(PLAIN), MIB, Duration::from_micros(400));
    assert_eq!(c.pick(period + 4), serving(STREAMING));
    // ... and one fast plain copy at the next try makes plain the choice again.
    assert_eq!(c.pick(3 * period), trying(PLAIN));
    c.record(trying(PLAIN), MIB, Duration::from_micros(31));
    assert_eq!(c.pick(3 * period + 1), serving(PLAIN));
}

/// The first try at or after `from` (ns), stepping a millisecond at a time.
fn next_try(c: &SizeClass, from: u64) -> u64 {
    (0..)
        .map(|i| from + i * 1_000_000)
        .find(|&t| c.pick(t).trying)
        .unwrap()
}

/// Each try that loses by far doubles the wait before the next one, up to the longest; the
/// choice's cost rising to `JUMP` times what it was at the last lost try brings the wait
/// back to the shortest, a single slow write does not.
#[test]
fn tries_that_lose_by_far_back_off_until_the_choice_jumps() {
    let c = SizeClass::new(1);
    let ms = 1_000_000;
    c.record(c.pick(0), MIB, Duration::from_micros(21));
    let mut last = next_try(&c, 1);
    let mut waits = vec![];
    for _ in 0..9 {
        c.record(trying(STREAMING), MIB, Duration::from_micros(500));
        let t = next_try(&c, last);
        waits.push((t - last) / ms);
        last = t;
    }
    assert_eq!(waits, [20, 40, 80, 160, 320, 640, 1280, 1280, 1280]);
    assert_eq!(
        StoreChoice::EXPLORE_PERIOD_MAX.as_millis(),
        1280,
        "the documented seven doublings"
    );
    c.record(trying(STREAMING), MIB, Duration::from_micros(500));
    // One slow write of the choice is an outlier ...
    let slow = Duration::from_micros(210);
    for took in [slow, Duration::from_micros(21)] {
        c.record(serving(PLAIN), MIB, took);
    }
    let t = next_try(&c, last);
    assert_eq!(t - last, 1280 * ms);
    last = t;
    c.record(trying(STREAMING), MIB, Duration::from_micros(500));
    // ... two in a row a change of state: the next try comes after the shortest wait.
    c.record(serving(PLAIN), MIB, slow);
    c.record(serving(PLAIN), MIB, slow);
    assert_eq!(next_try(&c, last) - last, 10 * ms);
}

/// A kind counted twice wins only where it costs less than half the other's, and its
/// tries lose by far from half of that (`LOSS`) on.
#[test]
fn a_weighted_kind_counts_its_cost_times_the_weight() {
    for (weight, wait) in [(1, 10), (2, 20)] {
        let c = SizeClass::new(weight);
        c.record(c.pick(0), MIB, Duration::from_micros(30)); // 28 ps/B
        let t = next_try(&c, 1);
        c.record(trying(STREAMING), MIB, Duration::from_micros(45)); // 42 ps/B
        assert_eq!(next_try(&c, t) - t, wait * 1_000_000, "weight {weight}");
    }
    let c = SizeClass::new(2);
    c.record(c.pick(0), MIB, Duration::from_micros(30));
    c.record(c.pick(1), MIB, Duration::from_micros(20)); // 19 ps/B, counted 38
    assert_eq!(c.pick(2), serving(PLAIN));
    c.record(trying(STREAMING), MIB, Duration::from_micros(13)); // 12 ps/B, counted 24
    assert_eq!(c.pick(3), serving(STREAMING));
}

/// Costs are picoseconds per byte; a lower sample replaces the cost, a higher one moves it
/// a quarter of the way, counting at most four times the cost.
#[test]
fn costs_fall_at_once_and_rise_slowly() {
    let c = SizeClass::new(1);
    c.record(serving(PLAIN), 1000, Duration::from_nanos(100));
    assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 100);
    c.record(serving(PLAIN), 1000, Duration::from_nanos(300));
    assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 150);
    c.record(serving(PLAIN), 1000, Duration::from_millis(5));
    assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 150 + 450 / 4);
    c.record(serving(PLAIN), 1000, Duration::from_nanos(50));
    assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 50);
    assert_eq!(c.cost[STREAMING].load(Ordering::Relaxed), 0);
}

#[test]
fn size_classes_are_powers_of_two_from_the_minimum() {
    let m = learner::MIN_BYTES.bytes();
    let classes: Vec<usize> = [m, 2 * m - 1, 2 * m, 4 * m, 100 * m, usize::MAX]
        .map(StoreChoice::class_of)
        .into();
    assert_eq!(classes, [0, 0, 1, 2, 6, 7]);
}
