//! Cross-mapping notify test: a notify and a doorbell whose words live in a shared-memory
//! segment, recorded through one mapping and waited on through another (as two processes
//! would), so the shared futex and the generation counter are exercised on real shm.

use std::sync::Arc;
use std::time::Duration;

use ampccl_runtime::doorbell::{Doorbell, DoorbellWords};
use ampccl_runtime::engine::Engine;
use ampccl_runtime::notify::Notify;
use ampccl_runtime::task::Task;

use super::segment::Segment;

#[test]
fn notify_in_shared_memory_wakes_a_waiter_through_another_mapping() {
    let owner = Arc::new(Segment::create(4096).unwrap());
    let other = Arc::new(Segment::open(owner.name(), 4096).unwrap());
    owner.unlink().unwrap();
    // Layout: doorbell words at 0, the notify counter at 64.
    // SAFETY: both mappings hold 4096 bytes, zeroed; the words are used atomically only.
    let (bell_a, bell_b, n_a, n_b) = unsafe {
        let bell_a = Doorbell::from_shared(owner.as_ptr().cast::<DoorbellWords>(), owner.clone());
        let bell_b = Doorbell::from_shared(other.as_ptr().cast::<DoorbellWords>(), other.clone());
        let n_a = Notify::from_shared(owner.as_ptr().add(64).cast(), bell_a.clone(), owner.clone());
        let n_b = Notify::from_shared(other.as_ptr().add(64).cast(), bell_b.clone(), other.clone());
        (bell_a, bell_b, n_a, n_b)
    };
    let engine = Engine::new(bell_b, Duration::from_secs(10));
    let s = engine.stream();
    for round in 0..3 {
        let target = n_b.next_wait();
        // SAFETY: no pointers.
        unsafe {
            s.enqueue(Task::Wait {
                notify: n_b.clone(),
                target,
            })
        };
        let recorder = {
            let n_a = n_a.clone();
            std::thread::spawn(move || {
                // Long enough for the waiter to go to sleep on the futex.
                std::thread::sleep(Duration::from_millis(30));
                n_a.record();
            })
        };
        let t0 = std::time::Instant::now();
        s.synchronize().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "round {round}: the waiter was not woken"
        );
        recorder.join().unwrap();
    }
    drop(bell_a);
}
