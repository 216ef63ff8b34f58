//! `ampccl-perf`: nccl-tests-style bandwidth sweeps of ampccl collectives.
//!
//! ```text
//! ampccl-perf -g 2 -b 8 -e 64M -f 2 -o allreduce -d float -r sum
//! ```
//! `-g N` launches N local ranks (this binary re-executed with a fresh unique id); without it
//! the process joins a job through the environment (`AMPCCL_UNIQUE_ID` + `RANK` +
//! `WORLD_SIZE`, or torchrun's `MASTER_ADDR`/`MASTER_PORT`/`RANK`/`WORLD_SIZE`). Columns and
//! bandwidth definitions follow nccl-tests: `algbw = size / time`, `busbw = algbw * factor`
//! (allreduce `2(n-1)/n`, allgather/reducescatter/alltoall `(n-1)/n`, others 1); time is the
//! slowest rank's mean over `-n` iterations. Exit code 1 when any result is wrong.

mod cli;
mod sweep;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    let result = match args.ranks {
        Some(n) if std::env::var_os(cli::CHILD_ENV).is_none() => cli::launch(n),
        _ => {
            cli::pin_if_launched();
            sweep::run(&args)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ampccl-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
