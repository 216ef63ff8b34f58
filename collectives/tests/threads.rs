//! Thread-mode multi-rank tests: every rank is a thread of this process (gloo's
//! `BaseTest::spawn` style), connected through the real shared-memory transport.

mod common;

use ampccl::ReduceOp;
use common::spawn;

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
