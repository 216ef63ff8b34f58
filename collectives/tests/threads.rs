//! Thread-mode multi-rank tests: every rank is a thread of this process (gloo's
//! `BaseTest::spawn` style), connected through the real shared-memory transport.

mod common;

use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Duration;

use ampccl::op::OpKind;
use ampccl::{Communicator, Config, Element, ReduceOp, bf16, f16};
use common::spawn_with;

/// Bytes of each CCL buffer in these tests (small, so large counts exercise chunking).
const BUFFSIZE: usize = 64 * 1024;

/// The test configuration: small CCL buffers, `forced` algorithms, cross-memory attach on or off.
fn config(forced: &[(OpKind, &str)], allow_cma: bool) -> Config {
    Config {
        timeout: Duration::from_secs(30),
        buffsize: BUFFSIZE,
        allow_cma,
        forced: forced
            .iter()
            .map(|&(k, name)| (k, name.to_string()))
            .collect::<HashMap<_, _>>(),
        ..Config::default()
    }
}

/// Runs `f` on `world` ranks with the default test configuration.
fn spawn<T: Send + 'static>(
    world: usize,
    f: impl Fn(Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    spawn_with(world, config(&[], true), f)
}

/// Element types of the tests, built from small integers (exact in every type, so float
/// results can be compared exactly).
trait Val: Element + PartialEq + Debug {
    const SIGNED: bool;
    const FLOAT: bool;
    fn of(x: f64) -> Self;
}

macro_rules! val {
    ($($t:ty: $signed:expr, $float:expr, |$x:ident| $conv:expr;)*) => {$(
        impl Val for $t {
            const SIGNED: bool = $signed;
            const FLOAT: bool = $float;
            fn of($x: f64) -> Self {
                $conv
            }
        }
    )*};
}
val! {
    f32: true, true, |x| x as f32;
    f64: true, true, |x| x;
    i32: true, false, |x| x as i32;
    u8: false, false, |x| x as u8;
    // f64 -> f32 -> half rounds like the library (divide in f32, narrow once): double
    // rounding through a format of more than twice the precision plus two bits is exact.
    bf16: true, true, |x| bf16::from_f32(x as f32);
    f16: true, true, |x| f16::from_f32(x as f32);
}

/// Counts of every test: empty, tiny, odd, and larger than a CCL buffer (chunking).
const COUNTS: [usize; 5] = [0, 1, 7, 1021, 50_003];

/// A value of rank `r` at index `i` that identifies both (for the data-movement collectives).
fn tagged<T: Val>(r: usize, i: usize) -> T {
    T::of(((r * 37 + i * 11) % 97) as f64)
}

/// A sentinel that no [`tagged`] value equals.
fn garbage<T: Val>() -> T {
    T::of(123.0)
}

/// Panics at the first index where `got` differs from `want(i)`.
fn check<T: Val>(what: &str, got: &[T], want: impl Fn(usize) -> T) {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        assert!(
            *g == w,
            "{what}: index {i} of {}: got {g:?}, want {w:?}",
            got.len()
        );
    }
}

fn all_gather_case<T: Val>(c: &Communicator, count: usize, in_place: bool) {
    let (me, world) = (c.rank(), c.world());
    let what = format!(
        "AllGather {} count {count} world {world} rank {me} in_place {in_place}",
        T::DTYPE.name()
    );
    let send: Vec<T> = (0..count).map(|i| tagged(me, i)).collect();
    let mut recv = vec![garbage::<T>(); count * world];
    if in_place {
        recv[me * count..][..count].copy_from_slice(&send);
        c.all_gather_in_place(&mut recv).unwrap();
    } else {
        c.all_gather(&send, &mut recv).unwrap();
    }
    check(&what, &recv, |i| tagged(i / count.max(1), i % count.max(1)));
}

fn all_gather_all(c: &Communicator) {
    for count in COUNTS {
        for in_place in [false, true] {
            all_gather_case::<f32>(c, count, in_place);
            all_gather_case::<u8>(c, count, in_place);
            all_gather_case::<bf16>(c, count, in_place);
        }
        all_gather_case::<i32>(c, count, false);
        all_gather_case::<f64>(c, count, true);
        all_gather_case::<f16>(c, count, false);
    }
}

/// Input of rank `r` at index `i` of a reduction with `op`: small integers whose sums and
/// products stay exact (and in range) in every test type.
fn red_input(op: ReduceOp, signed: bool, r: usize, i: usize) -> f64 {
    let k = i * 7 + r * 13;
    match op {
        ReduceOp::Prod if signed => [1.0, 2.0, 3.0, -2.0][k % 4],
        ReduceOp::Prod => [1.0, 2.0, 3.0][k % 3],
        _ if signed => (k % 21) as f64 - 10.0,
        _ => (k % 21) as f64,
    }
}

/// `op` over the ranks' inputs at index `i`, as the library defines it.
fn red_want<T: Val>(op: ReduceOp, world: usize, i: usize) -> T {
    let xs = (0..world).map(|r| red_input(op, T::SIGNED, r, i));
    let x = match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Prod => xs.product(),
        ReduceOp::Max => xs.fold(f64::MIN, f64::max),
        ReduceOp::Min => xs.fold(f64::MAX, f64::min),
        ReduceOp::Avg if T::FLOAT => xs.sum::<f64>() / world as f64,
        // Integer division truncates toward zero.
        ReduceOp::Avg => (xs.sum::<f64>() / world as f64).trunc(),
    };
    T::of(x)
}

fn reduce_scatter_case<T: Val>(c: &Communicator, count: usize, op: ReduceOp, in_place: bool) {
    let (me, world) = (c.rank(), c.world());
    let what = format!(
        "ReduceScatter {} {} count {count} world {world} rank {me} in_place {in_place}",
        T::DTYPE.name(),
        op.name()
    );
    let send: Vec<T> = (0..count * world)
        .map(|i| T::of(red_input(op, T::SIGNED, me, i)))
        .collect();
    let want = |i: usize| red_want::<T>(op, world, me * count + i);
    if in_place {
        let mut buf = send;
        c.reduce_scatter_in_place(&mut buf, op).unwrap();
        check(&what, &buf[me * count..][..count], want);
    } else {
        let mut recv = vec![garbage::<T>(); count];
        c.reduce_scatter(&send, &mut recv, op).unwrap();
        check(&what, &recv, want);
    }
}

fn reduce_scatter_all(c: &Communicator, ops: &[ReduceOp]) {
    for count in COUNTS {
        for &op in ops {
            for in_place in [false, true] {
                reduce_scatter_case::<f32>(c, count, op, in_place);
                reduce_scatter_case::<i32>(c, count, op, in_place);
            }
            reduce_scatter_case::<u8>(c, count, op, false);
            reduce_scatter_case::<f64>(c, count, op, true);
            reduce_scatter_case::<bf16>(c, count, op, false);
            reduce_scatter_case::<f16>(c, count, op, true);
        }
    }
}

fn all_to_all_case<T: Val>(c: &Communicator, count: usize) {
    let (me, world) = (c.rank(), c.world());
    let what = format!(
        "AllToAll {} count {count} world {world} rank {me}",
        T::DTYPE.name()
    );
    // Block j of rank r's input (for rank j) holds tagged(r * world + j, i).
    let send: Vec<T> = (0..count * world)
        .map(|i| tagged(me * world + i / count, i % count))
        .collect();
    let mut recv = vec![garbage::<T>(); count * world];
    c.all_to_all(&send, &mut recv).unwrap();
    // Block j of the output comes from rank j: its block for us.
    check(&what, &recv, |i| tagged(i / count * world + me, i % count));
}

fn all_to_all_all(c: &Communicator) {
    for count in COUNTS {
        all_to_all_case::<f32>(c, count);
        all_to_all_case::<u8>(c, count);
        all_to_all_case::<i32>(c, count);
        all_to_all_case::<f64>(c, count);
        all_to_all_case::<bf16>(c, count);
    }
}

/// Runs `f` on every world size 1..=4, with cross-memory attach (receives straight into user
/// memory) and without (bounce buffers), with `forced` algorithms.
fn each_setup(forced: &[(OpKind, &str)], f: fn(&Communicator)) {
    for allow_cma in [true, false] {
        for world in 1..=4 {
            spawn_with(world, config(forced, allow_cma), move |c| f(&c));
        }
    }
}

#[test]
fn allgather_mesh_forced() {
    each_setup(&[(OpKind::AllGather, "AllGatherMesh")], all_gather_all);
}

#[test]
fn allgather_ring_forced() {
    each_setup(&[(OpKind::AllGather, "AllGatherRing")], all_gather_all);
}

#[test]
fn allgather_default_selection() {
    each_setup(&[], all_gather_all);
}

#[test]
fn reduce_scatter_ring_forced_every_op() {
    each_setup(&[(OpKind::ReduceScatter, "ReduceScatterRing")], |c| {
        reduce_scatter_all(c, &ReduceOp::ALL)
    });
}

#[test]
fn reduce_scatter_default_selection() {
    each_setup(&[], |c| {
        reduce_scatter_all(c, &[ReduceOp::Sum, ReduceOp::Avg])
    });
}

#[test]
fn alltoall_pairwise_forced() {
    each_setup(&[(OpKind::AllToAll, "AllToAllPairwise")], all_to_all_all);
}

#[test]
fn alltoall_default_selection() {
    each_setup(&[], all_to_all_all);
}

/// Both allgather algorithms interleaved with the other collectives on one communicator: the
/// CCL buffers, links and streams they share must not leak data from one call into the next.
#[test]
fn mixed_collectives_share_resources() {
    for allow_cma in [true, false] {
        spawn_with(3, config(&[], allow_cma), |c| {
            for count in [5usize, 20_000, 3] {
                all_gather_case::<f32>(&c, count, false);
                reduce_scatter_case::<i32>(&c, count, ReduceOp::Sum, true);
                all_to_all_case::<u8>(&c, count);
                all_gather_case::<f32>(&c, count * 2, true);
            }
        });
    }
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
