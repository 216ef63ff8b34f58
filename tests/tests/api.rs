//! API features across processes: torchrun-style init, split, asynchronous operations on
//! streams (tokio and `futures`), destroy.

use std::time::Duration;

use ampccl::{Communicator, ReduceOp};
use ampccl_tests::{Launch, Outcome, ensure, err, free_port, init_comm, launch, worker};

#[test]
fn worker_entry() {
    worker(|scenario| match scenario {
        "torchrun_env" => torchrun_env(),
        "split" => split(),
        "async_tokio" => async_tokio(),
        "async_block_on" => async_block_on(),
        "destroy" => destroy(),
        "alternating_shapes" => alternating_shapes(),
        s => Err(format!("unknown scenario {s:?}")),
    });
}

/// `sum over ranks of (rank + 1)`, checked.
fn check_rank_sum(c: &Communicator, what: &str) -> Outcome {
    let mut x = [c.rank() as u64 + 1, 1];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)
        .map_err(err(what))?;
    let w = c.world() as u64;
    ensure(x == [w * (w + 1) / 2, w], || format!("{what}: got {x:?}"))
}

/// `Communicator::from_env` with `MASTER_ADDR`/`MASTER_PORT`/`RANK`/`WORLD_SIZE` only.
fn torchrun_env() -> Outcome {
    let c = Communicator::from_env().map_err(err("from_env"))?;
    let (rank, world) = ampccl_tests::rank_world();
    ensure(c.rank() == rank && c.world() == world, || {
        format!("from_env gave rank {}/{}", c.rank(), c.world())
    })?;
    check_rank_sum(&c, "allreduce over a torchrun-style communicator")
}

/// 4 ranks, `color = rank % 2`, `key = -rank`: two communicators of 2, each ordered by
/// descending global rank.
fn split() -> Outcome {
    let c = init_comm()?;
    let (rank, world) = (c.rank(), c.world());
    let sub = c
        .split((rank % 2) as i32, -(rank as i32))
        .map_err(err("split"))?
        .ok_or("split returned no communicator for a non-negative color")?;
    let members: Vec<usize> = (0..world).rev().filter(|r| r % 2 == rank % 2).collect();
    ensure(sub.world() == members.len(), || {
        format!("sub-communicator of {} ranks", sub.world())
    })?;
    let sub_rank = members.iter().position(|&r| r == rank).unwrap();
    ensure(sub.rank() == sub_rank, || {
        format!(
            "global rank {rank} is rank {} of its sub-communicator, expected {sub_rank}",
            sub.rank()
        )
    })?;
    // Slot i of the result is the global rank of sub-rank i (+1): membership and order.
    let mut slots = vec![0u32; sub.world()];
    slots[sub.rank()] = rank as u32 + 1;
    sub.all_reduce_in_place(&mut slots, ReduceOp::Sum)
        .map_err(err("allreduce on the sub-communicator"))?;
    let want: Vec<u32> = members.iter().map(|&r| r as u32 + 1).collect();
    ensure(slots == want, || {
        format!("sub-communicator slots {slots:?}, expected {want:?}")
    })?;
    // The parent keeps working, interleaved with the child.
    check_rank_sum(&c, "allreduce on the parent after split")?;
    check_rank_sum(&sub, "second allreduce on the sub-communicator")?;
    // A negative color joins nothing.
    let none = c
        .split(if rank == 0 { -1 } else { 7 }, 0)
        .map_err(err("split with NOCOLOR"))?;
    ensure(none.is_none() == (rank == 0), || {
        format!(
            "split with color -1 on rank 0 only: rank {rank} got {:?}",
            none.is_some()
        )
    })?;
    if let Some(rest) = none {
        check_rank_sum(&rest, "allreduce on the ranks 1.. communicator")?;
        rest.destroy().map_err(err("destroy of split"))?;
    }
    sub.destroy().map_err(err("destroy of sub"))?;
    c.destroy().map_err(err("destroy"))
}

fn inputs(rank: usize) -> (Vec<f32>, Vec<i64>) {
    let a = (0..4096).map(|i| (i % 13) as f32 + rank as f32).collect();
    let b = (0..1000).map(|i| i as i64 * (rank as i64 + 1)).collect();
    (a, b)
}

fn check_async(world: usize, a: &[f32], b: &[i64]) -> Outcome {
    let w = world as f32;
    for (i, v) in a.iter().enumerate() {
        let want = (i % 13) as f32 * w + w * (w - 1.0) / 2.0;
        if *v != want {
            return Err(format!("first allreduce [{i}] = {v}, expected {want}"));
        }
    }
    let f = (world * (world + 1) / 2) as i64;
    for (i, v) in b.iter().enumerate() {
        if *v != i as i64 * f {
            return Err(format!(
                "second allreduce [{i}] = {v}, expected {}",
                i as i64 * f
            ));
        }
    }
    Ok(())
}

/// Two allreduces enqueued on an explicit stream, then awaited under a current-thread tokio
/// runtime (second one first, then the first).
fn async_tokio() -> Outcome {
    let c = init_comm()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let s = c.stream();
        let (a, b) = inputs(c.rank());
        let fa = c
            .on(&s)
            .all_reduce(a, ReduceOp::Sum)
            .map_err(err("enqueue 1"))?;
        let fb = c
            .on(&s)
            .all_reduce(b, ReduceOp::Sum)
            .map_err(err("enqueue 2"))?;
        let b = tokio::time::timeout(Duration::from_secs(30), fb)
            .await
            .map_err(|_| "second allreduce did not complete in 30 s")?
            .map_err(err("second allreduce"))?;
        let a = fa.await.map_err(err("first allreduce"))?;
        check_async(c.world(), &a, &b)?;
        // Both at once on the default stream.
        let (a, b) = inputs(c.rank());
        let on = c.on(c.default_stream());
        let fa = on.all_reduce(a, ReduceOp::Sum).map_err(err("enqueue 3"))?;
        let fb = on.all_reduce(b, ReduceOp::Sum).map_err(err("enqueue 4"))?;
        let (a, b) = tokio::join!(fa, fb);
        check_async(
            c.world(),
            &a.map_err(err("third allreduce"))?,
            &b.map_err(err("fourth allreduce"))?,
        )
    })?;
    c.destroy().map_err(err("destroy"))
}

/// The same with `futures::executor::block_on` and `OpFuture::wait`.
fn async_block_on() -> Outcome {
    let c = init_comm()?;
    let s = c.stream();
    let (a, b) = inputs(c.rank());
    let fa = c
        .on(&s)
        .all_reduce(a, ReduceOp::Sum)
        .map_err(err("enqueue 1"))?;
    let fb = c
        .on(&s)
        .all_reduce(b, ReduceOp::Sum)
        .map_err(err("enqueue 2"))?;
    let (a, b) = futures::executor::block_on(async { futures::join!(fa, fb) });
    check_async(
        c.world(),
        &a.map_err(err("first allreduce"))?,
        &b.map_err(err("second allreduce"))?,
    )?;
    let (a, b) = inputs(c.rank());
    let fa = c
        .on(&s)
        .all_reduce(a, ReduceOp::Sum)
        .map_err(err("enqueue 3"))?;
    let fb = c
        .on(&s)
        .all_reduce(b, ReduceOp::Sum)
        .map_err(err("enqueue 4"))?;
    let b = fb.wait().map_err(err("wait 4"))?;
    let a = fa.wait().map_err(err("wait 3"))?;
    check_async(c.world(), &a, &b)?;
    c.destroy().map_err(err("destroy"))
}

/// `destroy` waits for pending work; a clone keeps the communicator alive after it.
fn destroy() -> Outcome {
    let c = init_comm()?;
    let keep = c.clone();
    let f = c
        .on(c.default_stream())
        .all_reduce(vec![1u8; 1 << 16], ReduceOp::Sum)
        .map_err(err("enqueue"))?;
    c.destroy()
        .map_err(err("destroy with an operation in flight"))?;
    let v = f.wait().map_err(err("wait after destroy"))?;
    ensure(v.iter().all(|&x| x as usize == keep.world()), || {
        "allreduce result wrong".into()
    })?;
    check_rank_sum(&keep, "allreduce on the surviving clone")?;
    keep.destroy().map_err(err("destroy of the last handle"))
}

/// Calls of several shapes in turn on one communicator, each result checked: first two
/// shapes alternating (each call finds its plan among the recent ones), then six in a cycle
/// (more shapes than the plan cache keeps: every call selects its plan anew).
fn alternating_shapes() -> Outcome {
    let c = init_comm()?;
    let (rank, world) = (c.rank(), c.world());
    let w = world as i64;
    let sum_of_ranks = w * (w - 1) / 2;
    let shape = |k: usize| -> Outcome {
        match k {
            0 => {
                let x = vec![rank as f32 + 1.0; 7];
                let mut y = vec![0f32; 7];
                c.all_reduce(&x, &mut y, ReduceOp::Sum)
                    .map_err(err("allreduce"))?;
                let want = (w * (w + 1) / 2) as f32;
                ensure(y.iter().all(|&v| v == want), || {
                    format!("allreduce sum: {y:?}")
                })
            }
            1 => {
                let mut b = vec![if rank == world - 1 { 42i64 } else { -1 }; 5];
                c.broadcast(&mut b, world - 1).map_err(err("broadcast"))?;
                ensure(b == [42; 5], || format!("broadcast: {b:?}"))
            }
            2 => {
                let mut m = [rank as u8, 200 - rank as u8, 3];
                c.all_reduce_in_place(&mut m, ReduceOp::Max)
                    .map_err(err("allreduce max"))?;
                ensure(m == [world as u8 - 1, 200, 3], || {
                    format!("allreduce max: {m:?}")
                })
            }
            3 => {
                let mut g = vec![0i64; 2 * world];
                c.all_gather(&[rank as i64, -(rank as i64)], &mut g)
                    .map_err(err("allgather"))?;
                let ok = (0..world).all(|r| g[2 * r] == r as i64 && g[2 * r + 1] == -(r as i64));
                ensure(ok, || format!("allgather: {g:?}"))
            }
            4 => {
                let mut r = [rank as i64; 3];
                c.reduce_in_place(&mut r, ReduceOp::Sum, 0)
                    .map_err(err("reduce"))?;
                ensure(rank != 0 || r == [sum_of_ranks; 3], || {
                    format!("reduce: {r:?}")
                })
            }
            _ => {
                let x = vec![rank as f32 + 1.0; 7];
                let mut y = vec![0f32; 7];
                c.all_reduce(&x, &mut y, ReduceOp::Min)
                    .map_err(err("allreduce min"))?;
                ensure(y.iter().all(|&v| v == 1.0), || {
                    format!("allreduce min: {y:?}")
                })
            }
        }
    };
    for i in 0..8 {
        shape(i % 2)?;
    }
    for i in 0..18 {
        shape(i % 6)?;
    }
    Ok(())
}

#[test]
fn alternating_shapes_w3() {
    launch(3, "alternating_shapes", &[]);
}

#[test]
fn torchrun_env_w2() {
    let port = free_port().to_string();
    Launch::new(2, "torchrun_env")
        .without_unique_id()
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .env("AMPCCL_TIMEOUT_S", "30")
        .deadline(Duration::from_secs(60))
        .run();
}

#[test]
fn split_w4() {
    launch(4, "split", &[]);
}

#[test]
fn async_tokio_w2() {
    launch(2, "async_tokio", &[]);
}

#[test]
fn async_tokio_w3() {
    launch(3, "async_tokio", &[]);
}

#[test]
fn async_block_on_w2() {
    launch(2, "async_block_on", &[]);
}

#[test]
fn destroy_w2() {
    launch(2, "destroy", &[]);
}
