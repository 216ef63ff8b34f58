//! The measurement loop: per size, warm-up, timed iterations (out-of-place and in-place),
//! slowest-rank time, optional result check; then the peak RSS of every rank, the CSV and
//! the plot.

use std::time::Instant;

use ampccl::{Communicator, DataType, Element, ReduceOp, SharedBuf, bf16, f16};

use crate::cli::{SweepArgs as Args, Workload, human_bytes};
use crate::csv::Row;
use crate::plot;
use crate::progress::Progress;
use crate::rss;

/// Numeric conversions the checker needs.
pub trait Num: Element + PartialEq {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
num!(i8, u8, i32, u32, i64, u64, f32, f64);

impl Num for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}

impl Num for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}

/// `$body` with `$t` the Rust element type of `$dtype` (an [`ampccl::DataType`]).
macro_rules! with_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        with_type!(@ $dtype, $t, $body; I8 i8, U8 u8, I32 i32, U32 u32, I64 i64, U64 u64,
                   F16 ::ampccl::f16, F32 f32, F64 f64, Bf16 ::ampccl::bf16)
    };
    (@ $dtype:expr, $t:ident, $body:expr; $($v:ident $ty:ty),*) => {
        match $dtype { $(::ampccl::DataType::$v => { type $t = $ty; $body })* }
    };
}
pub(crate) use with_type;

/// Collectives the tool can run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
    /// Paired ranks take turns: the even one sends, then receives the reply; time = half
    /// the round trip (as fabtests' `fi_rdm_pingpong` and IMB's PingPong report).
    PingPong,
}

impl Coll {
    pub(crate) fn parse(s: &str) -> Option<Coll> {
        Some(match s.replace(['_', '-'], "").to_lowercase().as_str() {
            "allreduce" => Coll::AllReduce,
            "allgather" => Coll::AllGather,
            "reducescatter" => Coll::ReduceScatter,
            "broadcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "alltoall" => Coll::AllToAll,
            "sendrecv" => Coll::SendRecv,
            "pingpong" => Coll::PingPong,
            _ => return None,
        })
    }

    /// nccl-tests' bus bandwidth factor.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            _ => 1.0,
        }
    }

    /// Whether the operation pairs rank `2i` with `2i + 1` (and needs an even world).
    pub(crate) fn pairs(self) -> bool {
        matches!(self, Coll::SendRecv | Coll::PingPong)
    }

    pub(crate) fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Elements of (input, output) for `size` bytes (nccl-tests: size = the larger buffer).
    pub(crate) fn counts(self, size: usize, e: usize, n: usize) -> (usize, usize) {
        let total = size / e;
        match self {
            Coll::AllGather => (total / n, total / n * n),
            Coll::ReduceScatter => (total / n * n, total / n),
            Coll::AllToAll => (total / n * n, total / n * n),
            _ => (total, total),
        }
    }
}

/// The sizes of a sweep: `min` (at least one element of `e` bytes), times `factor` (at least
/// 2), up to `max`.
pub(crate) fn sizes(min: usize, max: usize, factor: usize, e: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut size = min.max(e);
    while size <= max {
        v.push(size);
        size = match size.checked_mul(factor.max(2)) {
            Some(s) => s,
            None => break,
        };
    }
    v
}

/// Bytes of user buffers that [`measure`] holds for (`cin`, `cout`) elements of `e` bytes:
/// the input, the out-of-place output and the in-place buffer.
fn user_buffer_bytes(cin: usize, cout: usize, e: usize) -> usize {
    (cin + 2 * cin.max(cout)) * e
}

/// Value of element `i` of rank `r`'s input: small integers, so every sum and product is exact.
pub(crate) fn value(r: usize, i: usize) -> f64 {
    1.0 + ((r * 7 + i) % 2) as f64
}

/// Runs the sweep on this rank; rank 0 prints. Returns false when results were wrong.
pub fn run(args: &Args) -> Result<bool, String> {
    // Overlays are read before the sweep, so a bad file fails every rank at once, not after it.
    let overlay = plot::read_series(&args.overlay, plot::Placement::Out)?;
    let comm = Communicator::from_env().map_err(|e| {
        format!(
            "{e}\n(ampccl-perf -g N starts N ranks on this host itself; or start it under a \
             launcher: `ampccl-run -n N ampccl-perf ...`, torchrun --no-python, an MPICH-family \
             mpirun, or MASTER_ADDR/MASTER_PORT with RANK and WORLD_SIZE)"
        )
    })?;
    let r = with_type!(args.work.dtype, T => sweep::<T>(&comm, args, &overlay));
    let ok = r?;
    comm.destroy().map_err(|e| e.to_string())?;
    Ok(ok)
}

fn sweep<T: Num>(
    comm: &Communicator,
    args: &Args,
    overlay: &[plot::Series],
) -> Result<bool, String> {
    let work = &args.work;
    let coll = Coll::parse(&work.collective)
        .ok_or_else(|| format!("unknown collective {:?}", work.collective))?;
    let (n, rank) = (comm.world(), comm.rank());
    let e = size_of::<T>();
    if coll.pairs() && n % 2 == 1 && n > 1 {
        return Err(format!(
            "{} pairs ranks: use an even number of ranks",
            work.collective
        ));
    }
    let print = rank == 0;
    if print {
        println!(
            "# ampccl-perf {}: {} ranks, transport {} ({}), {} buffers, {} iterations, {} warm-up",
            work.collective,
            n,
            comm.transport_name(),
            match (comm.transport_name(), comm.uses_cross_memory_attach()) {
                ("shm", true) => "cross-memory attach",
                ("shm", false) => "bounce buffers",
                _ => "straight into user buffers",
            },
            if args.registered != 0 {
                "shared"
            } else {
                "heap"
            },
            args.iters,
            args.warmup
        );
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
    }
    let mut all_ok = true;
    let mut rows: Vec<Row> = Vec::new();
    let mut bus_sum = 0.0;
    let mut points = 0usize;
    let mut user_peak = 0usize;
    let sizes = sizes(work.min_bytes, work.max_bytes, work.factor, e);
    let progress = Progress::new(print, args.progress, sizes.len());
    for (i, &size) in sizes.iter().enumerate() {
        progress.step(i + 1, size, &work.collective);
        let (cin, cout) = coll.counts(size, e, n);
        user_peak = user_peak.max(user_buffer_bytes(cin, cout, e));
        let mut row = Vec::new();
        for in_place in [false, true] {
            let (t, wrong) = measure::<T>(comm, coll, args, cin, cout, in_place)?;
            let bytes = (cin.max(cout) * e) as f64;
            let algbw = bytes / t / 1e3;
            let busbw = algbw * coll.bus_factor(n);
            all_ok &= wrong == 0;
            if in_place {
                bus_sum += busbw;
                points += 1;
            }
            row.push((t, algbw, busbw, wrong));
        }
        if print {
            progress.clear();
            let redop = if coll.reduces() {
                work.op.name()
            } else {
                "none"
            };
            let root = if matches!(coll, Coll::Broadcast | Coll::Reduce) {
                args.root as i64
            } else {
                -1
            };
            let (bytes, count) = (cin.max(cout) * e, cin.max(cout));
            print!(
                "{bytes:>12} {count:>12} {:>8} {redop:>6} {root:>6}",
                work.dtype.name()
            );
            for (t, a, b, w) in &row {
                print!("   {t:>9.2} {a:>7.2} {b:>7.2} {w:>6}");
            }
            println!();
            for (&(time_us, algbw_gbs, busbw_gbs, wrong), place) in row.iter().zip(["out", "in"]) {
                rows.push(Row {
                    collective: work.collective.clone(),
                    ranks: n,
                    bytes,
                    count,
                    dtype: work.dtype.name().to_string(),
                    redop: redop.to_string(),
                    root,
                    placement: place.to_string(),
                    time_us,
                    algbw_gbs,
                    busbw_gbs,
                    wrong,
                });
            }
        }
    }
    progress.clear();
    let rss = peak_rss(comm)?;
    if print {
        println!(
            "# Out of bounds values : {}",
            if all_ok { "0 OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4}",
            if points > 0 {
                bus_sum / points as f64
            } else {
                0.0
            }
        );
        println!("{}", rss_line(&rss, user_peak));
        if let Some(path) = &args.csv {
            crate::csv::write(path, &rows)?;
        }
        if let Some(png) = &args.plot {
            let label = args
                .csv
                .as_deref()
                .map(plot::label_of)
                .unwrap_or_else(|| "ampccl".to_string());
            let mut series = plot::series(&label, &rows, plot::Placement::Out)?;
            series.extend_from_slice(overlay);
            let title = format!("{}, {n} ranks, {}", work.collective, work.dtype.name());
            plot::draw(png, &title, &series)?;
        }
    }
    Ok(all_ok)
}

/// Every rank's peak RSS in bytes (0 where unknown), gathered on all ranks.
fn peak_rss(comm: &Communicator) -> Result<Vec<u64>, String> {
    let mine = [rss::peak_bytes().unwrap_or(0)];
    let mut all = vec![0u64; comm.world()];
    comm.all_gather(&mine, &mut all)
        .map_err(|e| e.to_string())?;
    Ok(all)
}

/// `# Peak RSS per rank : r0 X MiB, r1 Y MiB; user buffers Z MiB`.
fn rss_line(rss: &[u64], user: usize) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let ranks: Vec<String> = rss
        .iter()
        .enumerate()
        .map(|(r, &b)| format!("r{r} {:.1} MiB", mib(b)))
        .collect();
    format!(
        "# Peak RSS per rank   : {}; user buffers {:.1} MiB ({})",
        ranks.join(", "),
        mib(user as u64),
        human_bytes(user)
    )
}

/// Mean time per call in µs (slowest rank) and the number of wrong elements (all ranks).
fn measure<T: Num>(
    comm: &Communicator,
    coll: Coll,
    a: &Args,
    cin: usize,
    cout: usize,
    in_place: bool,
) -> Result<(f64, usize), String> {
    let (n, rank) = (comm.world(), comm.rank());
    let shared = a.registered != 0;
    let zero = T::from_f64(0.0);
    let input = user_buf(cin, shared, |i| T::from_f64(value(rank, i)))?;
    let mut out = user_buf(cout.max(cin), shared, |_| zero)?;
    let mut buf = user_buf(cout.max(cin), shared, |i| {
        input.get(i).copied().unwrap_or(zero)
    })?;
    let call = |out: &mut Buf<T>, buf: &mut Buf<T>| -> ampccl::Result<()> {
        match (coll, in_place) {
            (Coll::AllReduce, false) => comm.all_reduce(&input, &mut out[..cout], a.work.op),
            (Coll::AllReduce, true) => comm.all_reduce_in_place(&mut buf[..cout], a.work.op),
            (Coll::AllGather, false) => comm.all_gather(&input, &mut out[..cout]),
            (Coll::AllGather, true) => comm.all_gather_in_place(&mut buf[..cout]),
            (Coll::ReduceScatter, false) => {
                comm.reduce_scatter(&input, &mut out[..cout], a.work.op)
            }
            (Coll::ReduceScatter, true) => comm.reduce_scatter_in_place(&mut buf[..cin], a.work.op),
            (Coll::Broadcast, false) => comm.broadcast_from(&input, &mut out[..cout], a.root),
            (Coll::Broadcast, true) => comm.broadcast(&mut buf[..cout], a.root),
            (Coll::Reduce, false) => comm.reduce(&input, &mut out[..cout], a.work.op, a.root),
            (Coll::Reduce, true) => comm.reduce_in_place(&mut buf[..cout], a.work.op, a.root),
            (Coll::AllToAll, _) => comm.all_to_all(&input, &mut out[..cout]),
            (Coll::SendRecv, _) => {
                let peer = rank ^ 1;
                if n == 1 {
                    out[..cout].copy_from_slice(&input);
                    return Ok(());
                }
                comm.group(|g| {
                    g.send(&input, peer)?;
                    g.recv(&mut out[..cout], peer)
                })
            }
            (Coll::PingPong, _) => {
                let peer = rank ^ 1;
                if n == 1 {
                    out[..cout].copy_from_slice(&input);
                } else if rank % 2 == 0 {
                    comm.send(&input, peer)?;
                    comm.recv(&mut out[..cout], peer)?;
                } else {
                    comm.recv(&mut out[..cout], peer)?;
                    comm.send(&input, peer)?;
                }
                Ok(())
            }
        }
    };
    let reset = |buf: &mut Buf<T>| {
        let start = match coll {
            Coll::AllGather if in_place => rank * cin,
            _ => 0,
        };
        buf[start..start + cin].copy_from_slice(&input);
    };
    for _ in 0..a.warmup {
        reset(&mut buf);
        call(&mut out, &mut buf).map_err(|e| e.to_string())?;
    }
    comm.barrier().map_err(|e| e.to_string())?;
    let per_iter = if coll == Coll::PingPong { 2.0 } else { 1.0 };
    let mut t = [if a.median {
        let mut each = Vec::with_capacity(a.iters);
        for _ in 0..a.iters {
            let t0 = Instant::now();
            call(&mut out, &mut buf).map_err(|e| e.to_string())?;
            each.push(t0.elapsed().as_secs_f64());
        }
        if each.is_empty() {
            0.0
        } else {
            crate::ceiling::median_min(each).0 * 1e6 / per_iter
        }
    } else {
        let t0 = Instant::now();
        for _ in 0..a.iters {
            call(&mut out, &mut buf).map_err(|e| e.to_string())?;
        }
        t0.elapsed().as_secs_f64() * 1e6 / (a.iters.max(1) as f64 * per_iter)
    }];
    comm.all_reduce_in_place(&mut t, ampccl::ReduceOp::Max)
        .map_err(|e| e.to_string())?;
    let mut wrong = 0usize;
    if a.check != 0 {
        reset(&mut buf);
        out.iter_mut().for_each(|x| *x = T::from_f64(0.0));
        call(&mut out, &mut buf).map_err(|e| e.to_string())?;
        let got = if in_place && coll != Coll::AllToAll && !coll.pairs() {
            &buf
        } else {
            &out
        };
        wrong = count_wrong(coll, &a.work, a.root, rank, n, cin, cout, in_place, got);
        let mut w = [wrong as u64];
        comm.all_reduce_in_place(&mut w, ampccl::ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        wrong = w[0] as usize;
    }
    Ok((t[0], wrong))
}

/// A user buffer of the sweep: on the heap, or in shared user memory (`-R 1`).
type Buf<T> = Box<dyn std::ops::DerefMut<Target = [T]>>;

/// `len` elements `f(0), f(1), …` in a [`Buf`].
fn user_buf<T: Element>(
    len: usize,
    shared: bool,
    f: impl FnMut(usize) -> T,
) -> Result<Buf<T>, String> {
    Ok(if shared {
        Box::new(SharedBuf::from_fn(len, f).map_err(|e| e.to_string())?)
    } else {
        Box::new((0..len).map(f).collect::<Vec<T>>())
    })
}

fn reduce_ref(op: ReduceOp, n: usize, i: usize, t: DataType) -> f64 {
    let vals = (0..n).map(|r| value(r, i));
    let v = match op {
        ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Max => vals.fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.fold(f64::MAX, f64::min),
    };
    match op {
        ReduceOp::Avg if t.is_float() => v / n as f64,
        ReduceOp::Avg => (v / n as f64).trunc(),
        _ => v,
    }
}

/// Wrong elements of rank `rank`'s result `got` (the output, or the in-place buffer), whose
/// inputs were filled with [`value`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn count_wrong<T: Num>(
    coll: Coll,
    w: &Workload,
    root: usize,
    rank: usize,
    n: usize,
    cin: usize,
    cout: usize,
    in_place: bool,
    got: &[T],
) -> usize {
    let tol = if w.dtype.is_float() { 1e-2 } else { 0.0 };
    let bad = |want: f64, g: T| ((g.to_f64() - want).abs() > tol * want.abs().max(1.0)) as usize;
    match coll {
        Coll::AllReduce => (0..cout)
            .map(|i| bad(reduce_ref(w.op, n, i, w.dtype), got[i]))
            .sum(),
        Coll::AllGather => (0..cout)
            .map(|i| bad(value(i / cin, i % cin), got[i]))
            .sum(),
        Coll::ReduceScatter => {
            let base = if in_place { rank * cout } else { 0 };
            (0..cout)
                .map(|i| bad(reduce_ref(w.op, n, rank * cout + i, w.dtype), got[base + i]))
                .sum()
        }
        Coll::Broadcast => (0..cout).map(|i| bad(value(root, i), got[i])).sum(),
        Coll::Reduce if rank == root => (0..cout)
            .map(|i| bad(reduce_ref(w.op, n, i, w.dtype), got[i]))
            .sum(),
        Coll::Reduce => 0,
        Coll::AllToAll => {
            let blk = cout / n.max(1);
            (0..cout)
                .map(|i| bad(value(i / blk.max(1), rank * blk + i % blk.max(1)), got[i]))
                .sum()
        }
        Coll::SendRecv | Coll::PingPong => {
            let peer = if n == 1 { rank } else { rank ^ 1 };
            (0..cout).map(|i| bad(value(peer, i), got[i])).sum()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_nccl_tests() {
        assert_eq!(sizes(8, 64, 2, 4), vec![8, 16, 32, 64]);
        assert_eq!(sizes(1, 10, 1, 4), vec![4, 8]);
        assert_eq!(sizes(8, 1 << 20, 4, 4).len(), 9);
        assert!(sizes(64, 8, 2, 4).is_empty());
        assert_eq!(sizes(usize::MAX / 2 + 1, usize::MAX, 2, 1).len(), 1);
    }

    #[test]
    fn user_buffers_count_input_output_and_in_place() {
        // allreduce 64 MiB of f32: input, output, in-place buffer.
        let (cin, cout) = Coll::AllReduce.counts(64 << 20, 4, 2);
        assert_eq!(user_buffer_bytes(cin, cout, 4), 192 << 20);
        // allgather 64 MiB on 2 ranks: a 32 MiB input, two 64 MiB buffers.
        let (cin, cout) = Coll::AllGather.counts(64 << 20, 4, 2);
        assert_eq!(user_buffer_bytes(cin, cout, 4), 160 << 20);
    }

    #[test]
    fn rss_line_names_every_rank() {
        let l = rss_line(&[100 << 20, 101 << 20], 192 << 20);
        assert_eq!(
            l,
            "# Peak RSS per rank   : r0 100.0 MiB, r1 101.0 MiB; user buffers 192.0 MiB (192 MiB)"
        );
    }
}
