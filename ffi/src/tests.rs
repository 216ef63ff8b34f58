//! The C ABI called from Rust threads of one process: `ampcclCommInitAll`, non-blocking init
//! polled through `ampcclCommGetAsyncError`, inits inside a group, one thread driving several
//! communicators in one group, a stream shared by communicators, queries racing with work,
//! abort then destroy.

use std::ffi::c_void;
use std::ptr::null_mut;

use crate::coll::ampcclAllReduce;
use crate::comm_api::*;
use crate::stream_api::*;
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;
use crate::{ampcclGetUniqueId, ampcclGroupEnd, ampcclGroupStart};

const F32: i32 = ampcclDataType_t::ampcclFloat32 as i32;
const SUM: i32 = ampcclRedOp_t::ampcclSum as i32;

/// A handle moved to another thread.
#[derive(Clone, Copy)]
struct Send<T>(T);
// SAFETY: the handles are thread-safe (every entry point is); the wrapper only carries them.
unsafe impl<T> std::marker::Send for Send<T> {}

/// Allreduces `n` floats of every comm in one group from this thread; checks the sums.
fn grouped_allreduce(comms: &[ampcclComm_t], stream: ampcclStream_t, n: usize) {
    let mut bufs: Vec<Vec<f32>> = (0..comms.len()).map(|r| vec![r as f32 + 1.0; n]).collect();
    assert_eq!(ampcclGroupStart(), ampcclSuccess);
    for (c, b) in comms.iter().zip(&mut bufs) {
        let p = b.as_mut_ptr() as *mut c_void;
        // SAFETY: live handles; the buffer outlives the synchronization below.
        let r = unsafe { ampcclAllReduce(p, p, n, F32, SUM, *c, stream) };
        assert_eq!(r, ampcclSuccess);
    }
    assert_eq!(ampcclGroupEnd(), ampcclSuccess);
    for &c in comms {
        // SAFETY: live handles.
        assert_eq!(unsafe { ampcclCommSynchronize(c) }, ampcclSuccess);
    }
    if !stream.is_null() {
        // SAFETY: a live stream.
        assert_eq!(unsafe { ampcclStreamQuery(stream) }, ampcclSuccess);
    }
    let w = comms.len() as f32;
    for b in &bufs {
        assert!(b.iter().all(|&x| x == w * (w + 1.0) / 2.0), "{:?}", &b[..4]);
    }
}

#[test]
fn init_all_group_over_comms_and_shared_stream() {
    let mut comms = [null_mut(); 3];
    // SAFETY: room for 3 handles; devlist may be NULL.
    assert_eq!(
        unsafe { ampcclCommInitAll(comms.as_mut_ptr(), 3, std::ptr::null()) },
        ampcclSuccess
    );
    grouped_allreduce(&comms, null_mut(), 1000);
    let mut s = null_mut();
    // SAFETY: writable out-pointer.
    assert_eq!(unsafe { ampcclStreamCreate(&mut s) }, ampcclSuccess);
    grouped_allreduce(&comms, s, 4099);
    grouped_allreduce(&comms, s, 1);
    // Another thread polls while this one works.
    let (sp, cp) = (Send(s), Send(comms[0]));
    let poller = std::thread::spawn(move || {
        for _ in 0..2000 {
            let (s, c) = (sp, cp);
            // SAFETY: live handles (joined before they are destroyed).
            let q = unsafe { ampcclStreamQuery(s.0) };
            assert!(matches!(q, ampcclSuccess | ampcclInProgress), "{q:?}");
            let mut e = ampcclSuccess;
            // SAFETY: as above.
            assert_eq!(
                unsafe { ampcclCommGetAsyncError(c.0, &mut e) },
                ampcclSuccess
            );
            assert_eq!(e, ampcclSuccess);
        }
    });
    grouped_allreduce(&comms, s, 77);
    poller.join().unwrap();
    // SAFETY: live handles, destroyed once.
    unsafe {
        assert_eq!(ampcclStreamDestroy(s), ampcclSuccess);
        for c in comms {
            assert_eq!(ampcclCommDestroy(c), ampcclSuccess);
        }
    }
}

fn unique_id() -> ampcclUniqueId {
    let mut id = ampcclUniqueId { internal: [0; 128] };
    // SAFETY: writable.
    assert_eq!(unsafe { ampcclGetUniqueId(&mut id) }, ampcclSuccess);
    id
}

#[test]
fn non_blocking_init_and_inits_in_a_group() {
    // Non-blocking: each rank's call returns InProgress at once; poll until Success.
    let id = unique_id();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                let mut cfg = ampcclConfig_t {
                    size: size_of::<ampcclConfig_t>(),
                    magic: AMPCCL_API_MAGIC,
                    version: AMPCCL_VERSION_CODE as u32,
                    blocking: 0,
                    splitShare: i32::MIN,
                    commName: c"nonblocking".as_ptr(),
                    timeoutS: 30,
                };
                let mut c = null_mut();
                // SAFETY: valid pointers.
                let r0 = unsafe { ampcclCommInitRankConfig(&mut c, 2, id, r, &mut cfg) };
                assert_eq!(r0, ampcclInProgress);
                let mut state = ampcclInProgress;
                while state == ampcclInProgress {
                    // SAFETY: a live handle.
                    assert_eq!(
                        unsafe { ampcclCommGetAsyncError(c, &mut state) },
                        ampcclSuccess
                    );
                    std::thread::yield_now();
                }
                assert_eq!(state, ampcclSuccess);
                Send(c)
            })
        })
        .collect();
    let comms: Vec<ampcclComm_t> = ranks.into_iter().map(|h| h.join().unwrap().0).collect();
    grouped_allreduce(&comms, null_mut(), 10);
    // Inits of both ranks from this one thread, inside a group (NCCL's multi-device idiom).
    let id = unique_id();
    let mut more = [null_mut(); 2];
    assert_eq!(ampcclGroupStart(), ampcclSuccess);
    for (r, c) in more.iter_mut().enumerate() {
        // SAFETY: valid pointers.
        assert_eq!(
            unsafe { ampcclCommInitRank(c, 2, id, r as i32) },
            ampcclSuccess
        );
    }
    assert_eq!(ampcclGroupEnd(), ampcclSuccess);
    grouped_allreduce(&more, null_mut(), 5);
    // Abort, then destroy: safe; calls in between fail cleanly.
    // SAFETY: live handles; each destroyed once.
    unsafe {
        for &c in &more {
            assert_eq!(ampcclCommAbort(c), ampcclSuccess);
        }
        let mut x = [0f32; 4];
        let p = x.as_mut_ptr() as *mut c_void;
        let r: ampcclResult_t = ampcclAllReduce(p, p, 4, F32, SUM, more[0], null_mut());
        assert_eq!(r, ampcclInvalidUsage);
        for c in more.into_iter().chain(comms) {
            assert_eq!(ampcclCommDestroy(c), ampcclSuccess);
        }
    }
}

/// Counts whose byte size is arithmetic that fits `size_t` but memory that cannot exist (a
/// negative count cast to `size_t`, `SIZE_MAX / 4` floats, a count times the rank count that
/// overflows) are refused at the call on the rank that makes it, every collective and both
/// sides of point-to-point, and the communicators stay usable.
#[test]
fn absurd_counts_are_refused_at_the_call_and_the_communicator_survives() {
    use crate::ampcclGetLastError;
    use crate::coll::*;
    let mut comms = [null_mut(); 2];
    // SAFETY: room for 2 handles; devlist may be NULL.
    assert_eq!(
        unsafe { ampcclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) },
        ampcclSuccess
    );
    let mut buf = vec![0f32; 64];
    let (p, c) = (buf.as_mut_ptr() as *mut c_void, comms[1]);
    let s = null_mut();
    for count in [
        usize::MAX,
        usize::MAX / 4,
        usize::MAX / 2 + 1,
        1 << 60,
        1 << 58,
    ] {
        // SAFETY (every call): a live communicator; the calls are refused before any buffer
        // is touched, which is what the test checks.
        let results: [(&str, ampcclResult_t); 8] = unsafe {
            [
                ("allreduce", ampcclAllReduce(p, p, count, F32, SUM, c, s)),
                ("allgather", ampcclAllGather(p, p, count, F32, c, s)),
                (
                    "reducescatter",
                    ampcclReduceScatter(p, p, count, F32, SUM, c, s),
                ),
                (
                    "broadcast (non-root)",
                    ampcclBroadcast(p, p, count, F32, 0, c, s),
                ),
                (
                    "reduce (non-root)",
                    ampcclReduce(p, p, count, F32, SUM, 0, c, s),
                ),
                ("alltoall", ampcclAlltoAll(p, p, count, F32, c, s)),
                ("send", ampcclSend(p, count, F32, 0, c, s)),
                ("recv", ampcclRecv(p, count, F32, 0, c, s)),
            ]
        };
        for (what, r) in results {
            assert_eq!(r, ampcclInvalidArgument, "{what} of {count} floats");
            // SAFETY: the per-thread message is a valid C string.
            let msg = unsafe { std::ffi::CStr::from_ptr(ampcclGetLastError(c)) };
            assert!(
                msg.to_string_lossy().contains("address space"),
                "{what}: {msg:?}"
            );
        }
    }
    grouped_allreduce(&comms, null_mut(), 1000);
    for c in comms {
        // SAFETY: live handles, destroyed once.
        assert_eq!(unsafe { ampcclCommDestroy(c) }, ampcclSuccess);
    }
}

/// Outside any launcher, `ampcclCommInitFromEnv` fails with a message saying what to start
/// the ranks with; a NULL output is refused.
#[test]
fn init_from_env_outside_a_launcher_says_what_to_set() {
    use crate::ampcclGetLastError;
    use crate::comm_api::ampcclCommInitFromEnv;
    // SAFETY: NULL is allowed (an error).
    assert_eq!(
        unsafe { ampcclCommInitFromEnv(null_mut()) },
        ampcclInvalidArgument
    );
    let launched = [
        "AMPCCL_UNIQUE_ID",
        "AMPCCL_RENDEZVOUS",
        "MASTER_ADDR",
        "PMI_FD",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_PROCID",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    if launched {
        println!("SKIPPED: the test process runs under a launcher's environment");
        return;
    }
    let mut comm = null_mut();
    // SAFETY: `comm` is writable.
    assert_eq!(
        unsafe { ampcclCommInitFromEnv(&mut comm) },
        ampcclInvalidArgument
    );
    assert!(comm.is_null());
    // SAFETY: the per-thread message is a valid C string.
    let msg = unsafe { std::ffi::CStr::from_ptr(ampcclGetLastError(null_mut())) };
    let msg = msg.to_string_lossy();
    assert!(
        msg.contains("no launcher found") && msg.contains("ampccl-run"),
        "{msg}"
    );
}
