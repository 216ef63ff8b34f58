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
//!
//! `--csv FILE` writes the results (format in [`csv`]), `--plot FILE.png` draws busbw and time
//! per call against size, with other CSVs (peers) added by `--overlay`; `ampccl-perf plot --out FILE.png
//! a.csv b.csv ...` draws CSVs alone; `ampccl-perf ceiling -o OP` measures the 2-rank
//! host-memory ceiling of a collective (see [`ceiling`]). Rank 0 shows progress on stderr when
//! it is a terminal (or with `--progress`) and ends with every rank's peak RSS.

mod ceiling;
mod cli;
mod csv;
mod plot;
mod progress;
mod rss;
mod sweep;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match (&cli.command, cli.sweep.ranks) {
        (Some(cli::Cmd::Plot(p)), _) => plot::run(p).map(|()| true),
        (Some(cli::Cmd::Ceiling(c)), _) => ceiling::run(c),
        (None, Some(n)) if std::env::var_os(cli::CHILD_ENV).is_none() => cli::launch(n),
        (None, _) => {
            cli::pin_if_launched();
            sweep::run(&cli.sweep)
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
