//! Thread-mode multi-rank tests: every rank is a thread of this process (gloo's
//! `BaseTest::spawn` style), connected through the real shared-memory transport.

use std::time::Duration;

use ampccl::registry::Registry;
use ampccl::{Communicator, Config, ReduceOp, UniqueId};

fn spawn<T: Send + 'static>(
    world: usize,
    f: impl Fn(Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let id = UniqueId::generate().unwrap();
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || {
                let cfg = Config {
                    timeout: Duration::from_secs(30),
                    buffsize: 64 * 1024,
                    ..Config::default()
                };
                let c = Communicator::init_with(&id, r, world, cfg, Registry::builtin()).unwrap();
                f(c)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn allreduce_sum_f32_all_sizes() {
    for world in 1..=4 {
        spawn(world, move |c| {
            for count in [0usize, 1, 7, 1021, 100_003] {
                let send: Vec<f32> = (0..count)
                    .map(|i| (i % 97) as f32 + c.rank() as f32)
                    .collect();
                let mut recv = vec![0f32; count];
                c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                for (i, v) in recv.iter().enumerate() {
                    let want: f32 = (0..world).map(|r| (i % 97) as f32 + r as f32).sum();
                    assert_eq!(*v, want, "world {world} count {count} index {i}");
                }
            }
        });
    }
}
