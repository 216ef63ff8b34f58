//! The waiting caller running its own work (see `stream`): a small operation is parked at the
//! call and run by the thread that synchronizes (stream, event, communicator), work of two
//! streams and two communicators, one thread driving two ranks, a failing and a timed-out
//! operation reporting at the synchronize, and waiters racing the engine thread for the same
//! work (run once: an in-place allreduce run twice would double the sums).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::coll::ampcclAllReduce;
use crate::comm_api::*;
use crate::stream::parked_by_this_thread;
use crate::stream_api::*;
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;
use crate::{ampcclGetLastError, ampcclGetUniqueId};

const F32: i32 = ampcclDataType_t::ampcclFloat32 as i32;
const SUM: i32 = ampcclRedOp_t::ampcclSum as i32;

/// A handle moved to another thread.
#[derive(Clone, Copy)]
struct H<T>(T);
// SAFETY: the handles are thread-safe (every entry point is); the wrapper only carries them.
unsafe impl<T> Send for H<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for H<T> {}

/// Two ranks of one communicator in this process.
fn two_ranks() -> [ampcclComm_t; 2] {
    let mut comms = [null_mut(); 2];
    // SAFETY: room for 2 handles; devlist may be NULL.
    let r = unsafe { ampcclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) };
    assert_eq!(r, ampcclSuccess);
    comms
}

fn new_stream() -> ampcclStream_t {
    let mut s = null_mut();
    // SAFETY: writable.
    assert_eq!(unsafe { ampcclStreamCreate(&mut s) }, ampcclSuccess);
    s
}

/// In-place allreduce of `buf` on `stream`.
fn allreduce(buf: &mut [f32], c: ampcclComm_t, stream: ampcclStream_t) -> ampcclResult_t {
    let p = buf.as_mut_ptr() as *mut c_void;
    // SAFETY: live handles; the callers synchronize before the buffer goes.
    unsafe { ampcclAllReduce(p, p, buf.len(), F32, SUM, c, stream) }
}

/// Runs `f(rank, comm)` on one thread per rank.
fn per_rank(comms: &[ampcclComm_t], f: impl Fn(usize, ampcclComm_t) + Sync) {
    std::thread::scope(|sc| {
        for (r, &c) in comms.iter().enumerate() {
            let (f, c) = (&f, H(c));
            sc.spawn(move || {
                let c = c;
                f(r, c.0)
            });
        }
    });
}

fn destroy(comms: &[ampcclComm_t]) {
    for &c in comms {
        // SAFETY: live handles, each destroyed once.
        assert_eq!(unsafe { ampcclCommDestroy(c) }, ampcclSuccess);
    }
}

#[test]
fn synchronize_runs_the_parked_work_itself() {
    let comms = two_ranks();
    // Rank 0 issues first in every iteration, so its operation cannot finish at its first
    // polls: it is parked (rank 1's may finish at once).
    let (parked, issued) = (AtomicUsize::new(0), AtomicUsize::new(0));
    per_rank(&comms, |r, c| {
        let s = new_stream();
        let mut e = null_mut();
        // SAFETY: writable.
        assert_eq!(unsafe { ampcclEventCreate(&mut e) }, ampcclSuccess);
        for i in 0..200 {
            let mut buf = [r as f32 + 1.0; 2];
            let stream = if i % 3 == 2 { null_mut() } else { s };
            while r == 1 && issued.load(Ordering::Acquire) <= i {
                std::hint::spin_loop();
            }
            assert_eq!(allreduce(&mut buf, c, stream), ampcclSuccess);
            // Held for this thread, not queued for the engine (rank 1's may have finished at
            // its first polls: rank 0's part was there already).
            let held = parked_by_this_thread();
            assert!(held <= 1, "iteration {i}");
            if r == 0 {
                parked.fetch_add(held, Ordering::Relaxed);
                issued.store(i + 1, Ordering::Release);
            }
            // SAFETY: live handles.
            let done = unsafe {
                match i % 3 {
                    0 => ampcclStreamSynchronize(s),
                    1 => {
                        assert_eq!(ampcclEventRecord(e, s), ampcclSuccess);
                        assert_eq!(parked_by_this_thread(), held, "a record leaves it parked");
                        ampcclEventSynchronize(e)
                    }
                    _ => ampcclCommSynchronize(c),
                }
            };
            assert_eq!(done, ampcclSuccess);
            assert_eq!(buf, [3.0; 2], "iteration {i}");
            assert_eq!(parked_by_this_thread(), 0);
        }
        // Larger operations are queued for the engine as before.
        let mut big = vec![1.0f32; (crate::stream::PARK_MAX_BYTES / 4) + 1];
        assert_eq!(allreduce(&mut big, c, s), ampcclSuccess);
        assert_eq!(parked_by_this_thread(), 0);
        // SAFETY: live handles.
        unsafe {
            assert_eq!(ampcclStreamSynchronize(s), ampcclSuccess);
            assert_eq!(ampcclEventDestroy(e), ampcclSuccess);
            assert_eq!(ampcclStreamDestroy(s), ampcclSuccess);
        }
        assert!(big.iter().all(|&x| x == 2.0));
    });
    // Parked every time, unless a thread was descheduled for a whole tick of the engine's
    // watch right after the call (the engine thread then takes the work over).
    let n = parked.into_inner();
    assert!(n >= 150, "{n} of 200 parked");
    destroy(&comms);
}

#[test]
fn two_streams_two_communicators_and_one_thread_driving_two_ranks() {
    let comms = two_ranks();
    // A second communicator of the same ranks (a split is collective: one thread per rank).
    let split: Vec<H<ampcclComm_t>> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .map(|&c| {
                let c = H(c);
                sc.spawn(move || {
                    let c = c;
                    let mut out = null_mut();
                    // SAFETY: a live handle; writable out-pointer; NULL config.
                    let r = unsafe { ampcclCommSplit(c.0, 0, 0, &mut out, null_mut()) };
                    assert_eq!(r, ampcclSuccess);
                    H(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let split: Vec<ampcclComm_t> = split.into_iter().map(|h| h.0).collect();
    let others = [H(split[0]), H(split[1])];
    per_rank(&comms, |r, c| {
        let (s0, s1) = (new_stream(), new_stream());
        let c2 = others[r].0;
        for i in 0..100 {
            let (mut a, mut b) = ([r as f32 + 1.0; 3], [r as f32 + 5.0; 5]);
            // Two streams of one communicator, then two communicators; synchronized in
            // either order.
            let second = if i % 2 == 0 { c } else { c2 };
            assert_eq!(allreduce(&mut a, c, s0), ampcclSuccess);
            assert_eq!(allreduce(&mut b, second, s1), ampcclSuccess);
            let (first, last) = if i % 4 < 2 { (s0, s1) } else { (s1, s0) };
            // SAFETY: live streams.
            unsafe {
                assert_eq!(ampcclStreamSynchronize(first), ampcclSuccess);
                assert_eq!(ampcclStreamSynchronize(last), ampcclSuccess);
            }
            assert_eq!((a, b), ([3.0; 3], [11.0; 5]), "iteration {i}");
        }
        // SAFETY: live streams.
        unsafe {
            assert_eq!(ampcclStreamDestroy(s0), ampcclSuccess);
            assert_eq!(ampcclStreamDestroy(s1), ampcclSuccess);
        }
    });
    // One thread, both ranks, no group: the synchronize of rank 0's stream hands rank 1's
    // parked operation to its engine, else rank 0 would wait for it in vain.
    let (s0, s1) = (new_stream(), new_stream());
    for _ in 0..20 {
        let (mut a, mut b) = ([1.0f32; 4], [2.0f32; 4]);
        assert_eq!(allreduce(&mut a, comms[0], s0), ampcclSuccess);
        assert_eq!(allreduce(&mut b, comms[1], s1), ampcclSuccess);
        // Rank 1 may finish at its first polls (rank 0's part is there already).
        assert!(parked_by_this_thread() >= 1);
        // SAFETY: live streams.
        unsafe {
            assert_eq!(ampcclStreamSynchronize(s0), ampcclSuccess);
            assert_eq!(ampcclStreamSynchronize(s1), ampcclSuccess);
        }
        assert_eq!((a, b), ([3.0; 4], [3.0; 4]));
    }
    destroy(&split);
    destroy(&comms);
}

#[test]
fn a_failing_parked_operation_reports_at_the_synchronize() {
    let comms = two_ranks();
    // Mismatched counts: issued fine, fails when it runs, on both ranks.
    per_rank(&comms, |r, c| {
        let s = new_stream();
        let mut buf = vec![1.0f32; 2 + r];
        // Parked, or failed already at its first poll when the peer's mismatched message was
        // there: either way the call succeeds and the synchronize reports.
        assert_eq!(allreduce(&mut buf, c, s), ampcclSuccess);
        // SAFETY: a live stream.
        let got = unsafe { ampcclStreamSynchronize(s) };
        assert_ne!(got, ampcclSuccess);
        // SAFETY: NULL asks for this thread's message.
        let msg = unsafe { std::ffi::CStr::from_ptr(ampcclGetLastError(null_mut())) };
        assert!(
            msg.to_string_lossy().contains("ampcclStreamSynchronize"),
            "{msg:?}"
        );
        // Sticky: the stream reports it again, and the communicator refuses new work.
        // SAFETY: a live stream.
        assert_eq!(unsafe { ampcclStreamSynchronize(s) }, got);
        let mut more = [1.0f32; 2];
        assert_ne!(allreduce(&mut more, c, s), ampcclSuccess);
    });
    for c in comms {
        // SAFETY: live handles, each destroyed once (after a failure: abort first).
        unsafe {
            assert_eq!(ampcclCommAbort(c), ampcclSuccess);
            assert_eq!(ampcclCommDestroy(c), ampcclSuccess);
        }
    }
}

/// Two ranks of a new communicator with `timeoutS` = `timeout`, each initialized on its thread.
fn two_ranks_with_timeout(timeout: i32) -> Vec<H<ampcclComm_t>> {
    let mut id = ampcclUniqueId { internal: [0; 128] };
    // SAFETY: writable.
    assert_eq!(unsafe { ampcclGetUniqueId(&mut id) }, ampcclSuccess);
    (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                let mut cfg = ampcclConfig_t {
                    size: size_of::<ampcclConfig_t>(),
                    magic: AMPCCL_API_MAGIC,
                    version: AMPCCL_VERSION_CODE as u32,
                    blocking: 1,
                    splitShare: i32::MIN,
                    commName: std::ptr::null(),
                    timeoutS: timeout,
                };
                let mut c = null_mut();
                // SAFETY: valid pointers.
                let r = unsafe { ampcclCommInitRankConfig(&mut c, 2, id, r, &mut cfg) };
                assert_eq!(r, ampcclSuccess);
                H(c)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect()
}

#[test]
fn an_abort_stops_a_waiter_running_parked_work() {
    let comms = two_ranks_with_timeout(60);
    let c0 = comms[0];
    // Rank 0 alone: its waiter runs the parked operation, which waits for rank 1.
    let waiter = std::thread::spawn(move || {
        let c0 = c0;
        let s = new_stream();
        let mut buf = [1.0f32; 2];
        assert_eq!(allreduce(&mut buf, c0.0, s), ampcclSuccess);
        assert_eq!(parked_by_this_thread(), 1);
        // SAFETY: a live stream.
        let r = unsafe { ampcclStreamSynchronize(s) };
        (r, std::time::Instant::now())
    });
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a live handle.
    assert_eq!(unsafe { ampcclCommAbort(comms[0].0) }, ampcclSuccess);
    let returned = std::time::Instant::now();
    let (r, stopped) = waiter.join().unwrap();
    assert_ne!(r, ampcclSuccess);
    // The waiter stopped at the abort, not at the 60 s timeout.
    assert!(
        stopped <= returned + Duration::from_secs(1),
        "{:?}",
        stopped - returned
    );
    for c in comms {
        // SAFETY: live handles, each destroyed once.
        unsafe {
            assert_eq!(ampcclCommAbort(c.0), ampcclSuccess);
            assert_eq!(ampcclCommDestroy(c.0), ampcclSuccess);
        }
    }
}

#[test]
fn a_parked_operation_without_its_peer_times_out_at_the_synchronize() {
    let comms = two_ranks_with_timeout(1);
    // Rank 0 alone: its operation waits for rank 1 until the communicator's timeout.
    let s = new_stream();
    let mut buf = [1.0f32; 2];
    assert_eq!(allreduce(&mut buf, comms[0].0, s), ampcclSuccess);
    assert_eq!(parked_by_this_thread(), 1);
    let t0 = std::time::Instant::now();
    // SAFETY: a live stream.
    assert_eq!(unsafe { ampcclStreamSynchronize(s) }, ampcclTimeout);
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    for c in comms {
        // SAFETY: live handles, each destroyed once.
        unsafe {
            assert_eq!(ampcclCommAbort(c.0), ampcclSuccess);
            assert_eq!(ampcclCommDestroy(c.0), ampcclSuccess);
        }
    }
}

#[test]
fn waiters_and_the_engine_thread_run_parked_work_once() {
    let comms = two_ranks();
    let (left, issued) = (AtomicUsize::new(0), AtomicUsize::new(0));
    per_rank(&comms, |r, c| {
        let s = H(new_stream());
        for i in 0..120u64 {
            let mut buf = [r as f32 + 1.0; 7];
            assert_eq!(allreduce(&mut buf, c, s.0), ampcclSuccess);
            // Sometimes nobody waits for a while: the engine thread takes the work over
            // (after one or two ticks of the engine's watch); sometimes another thread waits
            // for it too.
            match i % 4 {
                0 => std::thread::sleep(Duration::from_micros(300 * (i % 9))),
                1 => {
                    let other = std::thread::spawn(move || {
                        let s = s;
                        // SAFETY: a live stream (destroyed after the join below).
                        unsafe { ampcclStreamSynchronize(s.0) }
                    });
                    // SAFETY: a live stream.
                    assert_eq!(unsafe { ampcclStreamSynchronize(s.0) }, ampcclSuccess);
                    assert_eq!(other.join().unwrap(), ampcclSuccess);
                }
                _ => {}
            }
            // SAFETY: a live stream.
            assert_eq!(unsafe { ampcclStreamSynchronize(s.0) }, ampcclSuccess);
            // Run twice, an in-place allreduce would have summed the sums.
            assert_eq!(buf, [3.0; 7], "iteration {i}");
        }
        // Nobody waits at all: the engine thread runs it; queries see it finish.
        // Rank 0 first: its operation cannot finish at its first polls.
        let mut buf = [r as f32 + 1.0; 3];
        while r == 1 && issued.load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
        assert_eq!(allreduce(&mut buf, c, s.0), ampcclSuccess);
        if r == 0 {
            left.fetch_add(parked_by_this_thread(), Ordering::Relaxed);
            issued.store(1, Ordering::Release);
        }
        // Ticks of up to 8 ms after the waiters above claimed everything: at most 16 ms.
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(parked_by_this_thread(), 0, "the engine thread took it over");
        loop {
            // SAFETY: a live stream.
            match unsafe { ampcclStreamQuery(s.0) } {
                ampcclSuccess => break,
                ampcclInProgress => std::thread::yield_now(),
                e => panic!("{e:?}"),
            }
        }
        assert_eq!(buf, [3.0; 3]);
        // SAFETY: a live stream.
        assert_eq!(unsafe { ampcclStreamDestroy(s.0) }, ampcclSuccess);
    });
    // Rank 0 left its operation parked for the engine thread.
    assert_eq!(left.into_inner(), 1);
    destroy(&comms);
}
