//! Micro-benchmarks of the runtime's fixed costs:
//!
//! - `notify_round_trip_processes`: a notify in shared memory recorded by this process and
//!   answered by a child process through a second notify (the cross-process signal every
//!   transfer rests on), both sides spinning;
//! - `empty_collective`: a zero-count allreduce on a 1-rank communicator (framework cost of a
//!   call: checks, selection, resources, enqueue, completion);
//! - `allreduce_8b_world1`: the same with 8 bytes (one copy task).
//!
//! ```text
//! cargo bench -p ampccl-benches --bench micro
//! ```

use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ampccl::{Communicator, Config, ReduceOp, UniqueId};
use ampccl_transport::shm::segment::Segment;
use criterion::{Criterion, criterion_group};

/// Environment variable naming the segment in the child.
const CHILD: &str = "AMPCCL_MICRO_PONG";

/// The ping word at offset 0, the pong word at 64 (separate cache lines).
fn words(seg: &Segment) -> (&AtomicU32, &AtomicU32) {
    // SAFETY: the segment holds at least 128 zeroed bytes, used only through these atomics.
    unsafe {
        (
            AtomicU32::from_ptr(seg.as_ptr().cast()),
            AtomicU32::from_ptr(seg.as_ptr().add(64).cast()),
        )
    }
}

/// Child side: answer every ping with a pong until told to stop (ping == u32::MAX) or the
/// parent is gone.
fn pong(name: &str) {
    let seg = Segment::open(name, 4096).expect("child opens the segment");
    let (ping, pong) = words(&seg);
    let parent = std::os::unix::process::parent_id();
    let (mut seen, mut idle) = (0, 0u32);
    while seen != u32::MAX {
        let now = ping.load(Ordering::Acquire);
        if now != seen {
            seen = now;
            idle = 0;
            pong.store(now, Ordering::Release);
        } else {
            idle = idle.wrapping_add(1);
            if idle == 0 && std::os::unix::process::parent_id() != parent {
                return;
            }
            std::hint::spin_loop();
        }
    }
}

fn notify_round_trip(c: &mut Criterion) {
    let seg = Segment::create(4096).expect("segment");
    let child: Child = Command::new(std::env::current_exe().expect("exe"))
        .env(CHILD, seg.name())
        .spawn()
        .expect("spawn the pong process");
    let (ping, pong) = words(&seg);
    let mut n = 0u32;
    c.bench_function("notify_round_trip_processes", |b| {
        b.iter(|| {
            n += 1;
            ping.store(n, Ordering::Release);
            while pong.load(Ordering::Acquire) != n {
                std::hint::spin_loop();
            }
        })
    });
    ping.store(u32::MAX, Ordering::Release);
    let mut child = child;
    let _ = child.wait();
}

fn collectives(c: &mut Criterion) {
    let id = UniqueId::generate().expect("unique id");
    let comm = Communicator::init_with(
        &id,
        0,
        1,
        Config::default(),
        ampccl::registry::Registry::builtin(),
    )
    .expect("1-rank communicator");
    let comm = Arc::new(comm);
    let mut empty: [f32; 0] = [];
    c.bench_function("empty_collective", |b| {
        b.iter(|| {
            comm.all_reduce_in_place(&mut empty, ReduceOp::Sum)
                .expect("allreduce")
        })
    });
    let send = [1.0f32; 2];
    let mut recv = [0.0f32; 2];
    c.bench_function("allreduce_8b_world1", |b| {
        b.iter(|| {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)
                .expect("allreduce")
        })
    });
}

criterion_group!(benches, notify_round_trip, collectives);

fn main() {
    if let Ok(name) = std::env::var(CHILD) {
        pong(&name);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
