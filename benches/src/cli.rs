//! Command line and the local launcher (`-g N`).

use std::process::Command;

use ampccl::{DataType, ReduceOp, UniqueId};
use clap::Parser;

/// Set in the environment of ranks started by `-g`.
pub const CHILD_ENV: &str = "AMPCCL_PERF_CHILD";

/// nccl-tests-style sweep of one collective.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Args {
    /// Smallest size in bytes (K, M, G suffixes allowed).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: usize,
    /// Collective: allreduce, allgather, reducescatter, broadcast, reduce, alltoall, sendrecv.
    #[arg(short = 'o', long = "op", default_value = "allreduce")]
    pub collective: String,
    /// Data type (float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64).
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    pub dtype: DataType,
    /// Reduction operator (sum, prod, max, min, avg).
    #[arg(short = 'r', long = "redop", default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,
    /// Root rank for broadcast and reduce.
    #[arg(long = "root", default_value_t = 0)]
    pub root: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Check results (0 or 1).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Launch this many local ranks.
    #[arg(short = 'g', long = "ranks")]
    pub ranks: Option<usize>,
    /// Also write the results as CSV (rank 0).
    #[arg(long = "csv")]
    pub csv: Option<std::path::PathBuf>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mult)
        .map_err(|e| format!("bad size {s:?}: {e}"))
}

fn parse_dtype(s: &str) -> Result<DataType, String> {
    DataType::parse(s).ok_or_else(|| format!("unknown data type {s:?}"))
}

fn parse_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::parse(s).ok_or_else(|| format!("unknown reduction {s:?}"))
}

/// Starts `n` ranks of this binary with the same arguments and waits for them.
pub fn launch(n: usize) -> Result<bool, String> {
    if n == 0 {
        return Err("-g needs at least one rank".into());
    }
    let id = UniqueId::generate().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut children = Vec::new();
    for r in 0..n {
        let child = Command::new(&exe)
            .args(&args)
            .env(CHILD_ENV, "1")
            .env("AMPCCL_UNIQUE_ID", id.to_hex())
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .spawn()
            .map_err(|e| format!("cannot start rank {r}: {e}"))?;
        children.push(child);
    }
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait().map_err(|e| e.to_string())?;
        if !st.success() {
            eprintln!("ampccl-perf: rank {r} exited with {st}");
            ok = false;
        }
    }
    Ok(ok)
}

/// Pins a rank started by `-g` to one CPU (rank modulo the CPUs this process may use), as MPI
/// launchers do, so two lock-step ranks never share a core while another sits idle.
/// `AMPCCL_PERF_PIN=0` turns it off.
pub fn pin_if_launched() {
    if std::env::var_os(CHILD_ENV).is_none()
        || std::env::var("AMPCCL_PERF_PIN").as_deref() == Ok("0")
    {
        return;
    }
    let Some(rank) = std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse::<usize>().ok())
    else {
        return;
    };
    // SAFETY: `cpu_set_t` is plain data; the calls get valid pointers and its exact size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        if cpus.is_empty() {
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[rank % cpus.len()], &mut one);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one);
    }
}
