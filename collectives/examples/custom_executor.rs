//! Writing and registering your own algorithm.
//!
//! `AllReduceStar` gathers every rank's input at rank 0, reduces there and sends the result
//! back — not fast, but short. It is registered next to the built-ins and forced for AllReduce
//! (the same as `AMPCCL_ALGO_ALLREDUCE=AllReduceStar`), then run on 3 ranks (threads here; one
//! process per rank works the same). Messages must fit the CCL buffer: a real executor would
//! chunk (see `ampccl::steps::blocks::rounds`).
//!
//! ```text
//! cargo run --release -p ampccl --example custom_executor
//! ```

use std::sync::Arc;

use ampccl::executor::Executor;
use ampccl::op::{OpKind, OpParam};
use ampccl::registry::Registry;
use ampccl::resource::{AlgResourceRequest, AlgResourceResponse, BufKind, MAIN, Mem};
use ampccl::{Communicator, Config, ReduceOp, Result, UniqueId};

struct AllReduceStar;

impl Executor for AllReduceStar {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        // Rank 0 talks to everyone, the others only to rank 0.
        if p.rank == 0 {
            AlgResourceRequest::mesh(0, p.world)
        } else {
            AlgResourceRequest::with_peers(p.rank, [0])
        }
    }

    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        let bytes = p.count * p.elem();
        let (input, out) = (Mem::of(BufKind::UserIn), Mem::of(BufKind::UserOut));
        let slot = |r: usize| Mem::of(BufKind::CclIn).add(r * bytes);
        if p.rank == 0 {
            res.tasks.copy(MAIN, out, input, bytes)?;
            for r in 1..p.world {
                res.recv(MAIN, r, slot(r), bytes)?;
                res.tasks
                    .reduce(MAIN, p.dtype, p.op, out, out, slot(r), p.count)?;
            }
            if p.op == ReduceOp::Avg {
                res.tasks.finish_avg(MAIN, p.dtype, out, p.count, p.world)?;
            }
            for r in 1..p.world {
                res.send(MAIN, r, out, bytes)?;
            }
        } else {
            res.send(MAIN, 0, input, bytes)?;
            res.recv(MAIN, 0, slot(0), bytes)?;
            res.tasks.copy(MAIN, out, slot(0), bytes)?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let world = 3;
    let id = UniqueId::generate()?;
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || -> Result<Vec<f32>> {
                let mut registry = Registry::builtin();
                registry.register("AllReduceStar", OpKind::AllReduce, Arc::new(AllReduceStar))?;
                let mut config = Config::from_env()?;
                config
                    .forced
                    .insert(OpKind::AllReduce, "AllReduceStar".into());
                let comm = Communicator::init_with(&id, rank, world, config, registry)?;
                let send = vec![rank as f32 + 1.0; 1000];
                let mut recv = vec![0.0; 1000];
                comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
                Ok(recv)
            })
        })
        .collect();
    for (rank, t) in ranks.into_iter().enumerate() {
        let recv = t.join().expect("rank thread panicked")?;
        assert!(
            recv.iter().all(|&v| v == 6.0),
            "rank {rank} got a wrong sum"
        );
        println!("rank {rank}: AllReduceStar sum = {} (expected 6)", recv[0]);
    }
    Ok(())
}
