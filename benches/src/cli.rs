//! Command line and the local launcher (`-g N`).

use std::path::PathBuf;
use std::process::Command;

use ampccl::{DataType, ReduceOp, UniqueId};
use clap::{Parser, Subcommand};

use crate::plot::Placement;

/// Set in the environment of ranks started by `-g`.
pub const CHILD_ENV: &str = "AMPCCL_PERF_CHILD";

/// nccl-tests-style sweep of one collective (the default), `plot` of CSV results, or the
/// 2-rank host-memory `ceiling`.
#[derive(Parser, Debug)]
#[command(version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Cmd>,
    #[command(flatten)]
    pub sweep: SweepArgs,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Plot busbw and time per call against size (log axes) of ampccl-perf CSV files into a
    /// PNG, one series per file and collective, a marker at each measured size; the legend is
    /// each file's stem and the collective (e.g. `ampccl-perf plot --out cmp.png ampccl.csv
    /// intel-mpi.csv gloo.csv`).
    Plot(PlotArgs),
    /// Measure the host-memory ceiling of a 2-rank allreduce, allgather, reducescatter or
    /// broadcast: the memory passes every 2-rank implementation must make, done by two pinned
    /// threads of one process with the library's kernels (e.g. `ampccl-perf ceiling -o
    /// allreduce -b 64K -e 64M -f 4`).
    Ceiling(CeilingArgs),
}

/// `ampccl-perf plot`.
#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// PNG to write.
    #[arg(long = "out")]
    pub out: PathBuf,
    /// Title (default: the collective and rank count of the first file).
    #[arg(long = "title")]
    pub title: Option<String>,
    /// Which rows of the CSVs to plot.
    #[arg(long = "placement", value_enum, default_value_t = Placement::Out)]
    pub placement: Placement,
    /// CSV files written by `--csv` (or by benches/scripts/compare_peers.py).
    #[arg(required = true)]
    pub csv: Vec<PathBuf>,
}

/// What a run measures (nccl-tests' names), shared by the sweep and `ceiling`.
#[derive(clap::Args, Debug, Clone)]
pub struct Workload {
    /// Smallest size in bytes (K, M, G suffixes allowed).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: usize,
    /// Collective: allreduce, allgather, reducescatter, broadcast, reduce, alltoall, sendrecv,
    /// pingpong (time: half the round trip).
    #[arg(short = 'o', long = "op", default_value = "allreduce")]
    pub collective: String,
    /// Data type (float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64).
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    pub dtype: DataType,
    /// Reduction operator (sum, prod, max, min, avg).
    #[arg(short = 'r', long = "redop", default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,
}

/// The sweep's options (nccl-tests' names).
#[derive(clap::Args, Debug, Clone)]
pub struct SweepArgs {
    #[command(flatten)]
    pub work: Workload,
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
    /// Time every call and report the median instead of the mean (the slowest rank's
    /// median): one slow spell of a shared host then moves the figure by at most one call.
    #[arg(long = "median")]
    pub median: bool,
    /// User buffers in shared user memory, which peers reach directly (1), or on the heap (0):
    /// nccl-tests' `-R` (buffer registration), here `ampccl::SharedBuf`.
    #[arg(short = 'R', long = "registered", default_value_t = 0)]
    pub registered: u8,
    /// Launch this many local ranks.
    #[arg(short = 'g', long = "ranks")]
    pub ranks: Option<usize>,
    /// Also write the results as CSV (rank 0).
    #[arg(long = "csv")]
    pub csv: Option<PathBuf>,
    /// Also plot busbw vs size of this run (out-of-place) into this PNG (rank 0).
    #[arg(long = "plot")]
    pub plot: Option<PathBuf>,
    /// Another CSV to draw on the `--plot` (repeatable), e.g. a peer's results.
    #[arg(long = "overlay", requires = "plot")]
    pub overlay: Vec<PathBuf>,
    /// Show progress on stderr even when it is not a terminal.
    #[arg(long = "progress")]
    pub progress: bool,
}

/// `ampccl-perf ceiling`.
#[derive(clap::Args, Debug, Clone)]
pub struct CeilingArgs {
    #[command(flatten)]
    pub work: Workload,
    /// Timed iterations per size (default: about 256 MiB moved per size, 20..1000).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<usize>,
    /// Warm-up iterations per size (default: a quarter of the timed ones, at least 5).
    #[arg(short = 'w', long = "warmup_iters")]
    pub warmup: Option<usize>,
    /// Also write the results as CSV (placement `out`, broadcast `in`).
    #[arg(long = "csv")]
    pub csv: Option<PathBuf>,
    /// Broadcast only: the root's thread writes every byte into a ring of shared memory that
    /// the other thread copies out of, the ceiling of ranks whose user buffers the peer cannot
    /// reach (heap buffers; `ampccl-perf` without `-R 1`).
    #[arg(long = "staged")]
    pub staged: bool,
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

/// `bytes` as a short size with a binary suffix when it divides evenly (`4 MiB`, `1536 B`).
pub fn human_bytes(bytes: usize) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
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
    let cpus = allowed_cpus();
    if !cpus.is_empty() {
        pin_current_thread(cpus[rank % cpus.len()]);
    }
}

/// The CPUs this process may run on (its affinity mask), ascending; empty if unknown.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data; the call gets a valid pointer and its exact size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`; false if the kernel refused.
pub fn pin_current_thread(cpu: usize) -> bool {
    // SAFETY: `cpu_set_t` is plain data; the call gets a valid pointer and its exact size
    // (pid 0: the calling thread).
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_and_parse_back() {
        for b in [1usize, 8, 1000, 1536, 1 << 10, 3 << 20, 64 << 20, 2 << 30] {
            let h = human_bytes(b);
            let compact = h.replace(" B", "").replace("iB", "").replace(' ', "");
            assert_eq!(parse_size(&compact), Ok(b), "{h}");
        }
        assert_eq!(human_bytes(4 << 20), "4 MiB");
        assert_eq!(human_bytes(1536), "1536 B");
    }

    #[test]
    fn plot_is_a_subcommand_and_overlay_needs_plot() {
        let c = Cli::try_parse_from(["p", "plot", "--out", "x.png", "a.csv", "b.csv"]).unwrap();
        match c.command {
            Some(Cmd::Plot(p)) => assert_eq!(p.csv.len(), 2),
            _ => panic!("not plot"),
        }
        assert!(Cli::try_parse_from(["p", "plot", "--out", "x.png"]).is_err());
        assert!(Cli::try_parse_from(["p", "-g", "2", "plot", "--out", "x.png", "a.csv"]).is_err());
        assert!(Cli::try_parse_from(["p", "--overlay", "a.csv"]).is_err());
        let c = Cli::try_parse_from(["p", "-e", "1M", "--plot", "x.png", "--overlay", "a.csv"])
            .unwrap();
        assert!(c.command.is_none());
        assert_eq!(c.sweep.work.max_bytes, 1 << 20);
        assert_eq!(c.sweep.overlay.len(), 1);
    }

    #[test]
    fn ceiling_shares_the_workload_options_and_leaves_iterations_open() {
        let c = Cli::try_parse_from(["p", "ceiling", "-o", "allgather", "-e", "1M", "-d", "int8"])
            .unwrap();
        match c.command {
            Some(Cmd::Ceiling(a)) => {
                assert_eq!(
                    (a.work.collective.as_str(), a.work.max_bytes),
                    ("allgather", 1 << 20)
                );
                assert_eq!(a.work.dtype, DataType::I8);
                assert_eq!((a.iters, a.warmup), (None, None));
            }
            _ => panic!("not ceiling"),
        }
        assert!(Cli::try_parse_from(["p", "-g", "2", "ceiling"]).is_err());
        assert!(Cli::try_parse_from(["p", "ceiling", "-g", "2"]).is_err());
    }
}
