//! `ampccl-perf ceiling`: the host-memory ceiling of a 2-rank collective on this machine.
//!
//! Two threads of one process play the two ranks, each pinned to its own CPU (the first two of
//! the process's affinity mask). Each allocates and first-touches its own buffers, then hands
//! the other raw pointers to them. The address space is shared: no system calls, no protocol,
//! no shared-memory windows, no staging copies. What is left are the memory passes every 2-rank
//! implementation must make, done with the library's own kernels
//! ([`ampccl_runtime::reduce::reduce`], `finish_avg`, [`ampccl_runtime::copy::copy`]); rank r,
//! peer p:
//!
//! * allreduce (N bytes): r reduces half r of both inputs into its output, in blocks of 64 KiB,
//!   and copies each block, still in cache, into p's output;
//! * reducescatter (N = input bytes): r reduces block r of both inputs into its output;
//! * allgather (N = output bytes): r copies its input into block r of its own output, and that
//!   block into p's (64 KiB blocks); from [`copy::STREAM_MIN`] bytes per rank straight from the
//!   input into both, which lets `copy` stream both (15-20 % faster at 64 MiB here);
//! * broadcast (root 0, in place): r copies half r of rank 0's buffer into rank 1's;
//! * broadcast `--staged`: rank 0 copies the whole buffer, in `BroadcastPair`'s chunks, into
//!   a ring of [`STAGE_SLOTS`] slots that rank 1 allocated, and rank 1 copies each chunk out
//!   into its buffer as soon as it is there (a counter per side, on its own cache line).
//!   Between processes whose user buffers the peer cannot reach (heap memory, no
//!   cross-memory attach) this is the least a broadcast does: only the root holds the data, so
//!   its core alone writes every byte into memory both processes map, and the receiver's core
//!   copies every byte out. It bounds `ampccl-perf` without `-R 1` as the plain ceiling bounds
//!   it with `-R 1`.
//!
//! Why it is a ceiling: any 2-rank implementation reads each input byte at least once, brings
//! the two inputs of each reduced element together in one core, and writes every output byte;
//! here each of these happens once, the work is split evenly over both cores, and the only
//! synchronisation is one spin barrier per iteration. A library between processes adds
//! protocol, system calls or staging through shared windows on top. So the busbw here bounds
//! what a 2-rank implementation built on these kernels reaches on this machine, and a library's
//! time divided into this one is the fraction of the ceiling it reaches. (Reductions write
//! with plain stores; reducing into a cached scratch block and streaming it out with
//! `copy_out` measured no faster for allreduce and reducescatter.)
//!
//! Timing: a barrier, thread 0 reads the clock, both work, a barrier, thread 0 reads the clock
//! again; per size the median (and the minimum) of the timed iterations. The staged broadcast
//! has no barriers between iterations: as with a library's back-to-back calls, the root goes on
//! with the next iteration while the other thread copies out the last chunks, and thread 0's
//! iteration (its chunks copied in, each after its slot was freed) is timed. Then both inputs are
//! refilled with different integer patterns (the sweep's `-c` data), one more iteration runs,
//! and each thread counts the wrong elements of its own result.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Instant;

use ampccl::algorithms::broadcast_pair;
use ampccl::steps::blocks::{Blocks, chunk_elems, rounds};
use ampccl::{DataType, ReduceOp};
use ampccl_runtime::{copy, reduce};

use crate::cli::{CeilingArgs, allowed_cpus, pin_current_thread};
use crate::csv::Row;
use crate::sweep::{Coll, Num, count_wrong, sizes, value, with_type};

/// Blocks of at most this many bytes: reduced (or copied in), then copied to the peer while
/// still in cache.
const BLOCK: usize = 64 << 10;

/// Slot size of the staged broadcast's ring: its chunks are `BroadcastPair`'s
/// ([`broadcast_pair::chunk_bytes`]), at most this.
fn stage_chunk() -> usize {
    broadcast_pair::max_chunk_bytes()
}

/// Slots of the staged broadcast's ring (a 4 MiB ring, the size of the library's window).
const STAGE_SLOTS: usize = 8;

/// The table's column heads, over the rows printed in [`ceiling`].
const HEADER: &str = "\
#       size        count     type  redop   root        time       min   algbw   busbw #wrong
#        (B)   (elements)                          (us, med)      (us)  (GB/s)  (GB/s)";

/// Timed and warm-up iterations for `size` bytes: the given ones, else peer_bench.py's policy
/// (about 256 MiB moved, 20..1000 timed; a quarter of the timed ones, at least 5, warm-up).
fn iterations(size: usize, iters: Option<usize>, warmup: Option<usize>) -> (usize, usize) {
    let n = iters
        .unwrap_or(((256usize << 20) / size.max(1)).clamp(20, 1000))
        .max(1);
    (n, warmup.unwrap_or((n / 4).max(5)))
}

/// Median and minimum of `t` (not empty).
pub(crate) fn median_min(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    ((t[(t.len() - 1) / 2] + t[t.len() / 2]) / 2.0, t[0])
}

/// A barrier of the two threads: each counts its own arrivals (on its own cache line) and
/// spins until the other has arrived as often.
#[derive(Default)]
struct SpinBarrier([Padded; 2]);

#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl SpinBarrier {
    fn wait(&self, rank: usize) {
        let mine = self.0[rank].0.fetch_add(1, Ordering::AcqRel) + 1;
        self.0[1 - rank].wait_for(mine);
    }
}

impl Padded {
    /// Spins until the counter reaches `at_least` (acquiring what its writer did before).
    fn wait_for(&self, at_least: u64) {
        let mut spins = 0u32;
        while self.0.load(Ordering::Acquire) < at_least {
            // Give the CPU away only when the peer is clearly not running.
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// One thread's buffers; in place (broadcast) `output == input`. `staging`: rank 1's ring of
/// the staged broadcast (else null).
#[derive(Clone, Copy)]
struct Bufs {
    input: *mut u8,
    output: *mut u8,
    staging: *mut u8,
}

// SAFETY: the pointers are dereferenced only between barriers (or, for the staged ring, counts
// of chunks copied in and out) that separate every write of a byte from every other access to
// it (see `Job::run`); the owner frees the buffers only after the last barrier of their size,
// which the peer passes after its last access.
unsafe impl Send for Bufs {}

/// What both threads share: the barrier, each thread's buffers, the wrong elements of a size,
/// and the staged broadcast's chunks copied in (`staged[0]`, by rank 0) and out (`staged[1]`),
/// counted over the whole run.
#[derive(Default)]
struct Shared {
    barrier: SpinBarrier,
    slots: Mutex<[Option<Bufs>; 2]>,
    wrong: AtomicUsize,
    staged: [Padded; 2],
}

/// One size of the collective: elements of each input and output.
#[derive(Clone, Copy)]
struct Job {
    coll: Coll,
    dtype: DataType,
    op: ReduceOp,
    cin: usize,
    cout: usize,
    staged: bool,
}

/// Runs `ampccl-perf ceiling`; false when a result was wrong.
pub fn run(args: &CeilingArgs) -> Result<bool, String> {
    with_type!(args.work.dtype, T => ceiling::<T>(args))
}

fn ceiling<T: Num>(args: &CeilingArgs) -> Result<bool, String> {
    let w = &args.work;
    let coll = Coll::parse(&w.collective)
        .filter(|c| !matches!(c, Coll::Reduce | Coll::AllToAll) && !c.pairs())
        .ok_or_else(|| format!("ceiling: unknown collective {:?}", w.collective))?;
    if args.staged && coll != Coll::Broadcast {
        return Err("ceiling: --staged is a broadcast's ceiling".into());
    }
    let e = size_of::<T>();
    let cpus = allowed_cpus();
    let pins = (cpus.len() >= 2).then(|| [cpus[0], cpus[1]]);
    let given = |v: Option<usize>| v.map_or("per-size".to_string(), |v| v.to_string());
    let iters = match (args.iters, args.warmup) {
        (None, None) => "about 256 MiB moved per size, 20..1000 iterations".to_string(),
        (n, w) => format!("{} iterations, {} warm-up", given(n), given(w)),
    };
    let kind = if args.staged {
        "staged ceiling (the root's thread writes every byte into a ring the other copies out \
         of; "
    } else {
        "shared-address-space ceiling ("
    };
    println!(
        "# ampccl-perf ceiling {}: the 2-thread {kind}2 threads of one process, library kernels, \
         no transport), {iters}",
        w.collective
    );
    match pins {
        Some([a, b]) => println!("# threads pinned to CPUs {a} and {b}"),
        None => {
            println!("# fewer than 2 CPUs available ({cpus:?}): threads unpinned");
            eprintln!("ampccl-perf ceiling: fewer than 2 CPUs available, threads unpinned");
        }
    }
    println!("{HEADER}");
    let redop = if coll.reduces() { w.op.name() } else { "none" };
    let root: i64 = if coll == Coll::Broadcast { 0 } else { -1 };
    let sizes = sizes(w.min_bytes, w.max_bytes, w.factor, e);
    let shared = Shared::default();
    let (tx, rx) = mpsc::channel();
    let mut rows = Vec::new();
    std::thread::scope(|s| {
        let (sh, sz) = (&shared, &sizes);
        let cpu = |r: usize| pins.map(|p| p[r]);
        s.spawn(move || worker::<T>(1, cpu(1), sh, args, coll, sz, None));
        s.spawn(move || worker::<T>(0, cpu(0), sh, args, coll, sz, Some(tx)));
        for (job, median_us, min_us, wrong) in rx {
            let (bytes, count) = (job.cin.max(job.cout) * e, job.cin.max(job.cout));
            let algbw = bytes as f64 / median_us / 1e3;
            let busbw = algbw * coll.bus_factor(2);
            let ty = w.dtype.name();
            println!(
                "{bytes:>12} {count:>12} {ty:>8} {redop:>6} {root:>6}   {median_us:>9.2} \
                 {min_us:>9.2} {algbw:>7.2} {busbw:>7.2} {wrong:>6}"
            );
            let placement = if coll == Coll::Broadcast { "in" } else { "out" };
            rows.push(Row {
                collective: w.collective.clone(),
                ranks: 2,
                bytes,
                count,
                dtype: ty.to_string(),
                redop: redop.to_string(),
                root,
                placement: placement.to_string(),
                time_us: median_us,
                algbw_gbs: algbw,
                busbw_gbs: busbw,
                wrong,
            });
        }
    });
    let all_ok = rows.iter().all(|r| r.wrong == 0);
    let bus = rows.iter().map(|r| r.busbw_gbs).sum::<f64>() / rows.len().max(1) as f64;
    let ok = if all_ok { "0 OK" } else { "FAILED" };
    println!("# Out of bounds values : {ok}\n# Avg bus bandwidth    : {bus:.4}");
    if let Some(path) = &args.csv {
        crate::csv::write(path, &rows)?;
    }
    Ok(all_ok)
}

/// Thread `rank`'s part of every size; thread 0 sends each size's (job, median, min, wrong).
fn worker<T: Num>(
    rank: usize,
    cpu: Option<usize>,
    sh: &Shared,
    args: &CeilingArgs,
    coll: Coll,
    sizes: &[usize],
    tx: Option<mpsc::Sender<(Job, f64, f64, usize)>>,
) {
    if let Some(c) = cpu
        && !pin_current_thread(c)
    {
        eprintln!("ampccl-perf ceiling: cannot pin thread {rank} to CPU {c}");
    }
    let (w, e, zero) = (&args.work, size_of::<T>(), T::from_f64(0.0));
    let bcast = coll == Coll::Broadcast;
    for &size in sizes {
        let (cin, cout) = coll.counts(size, e, 2);
        let job = Job {
            coll,
            dtype: w.dtype,
            op: w.op,
            cin,
            cout,
            staged: args.staged,
        };
        let (n, warm) = iterations(size, args.iters, args.warmup);
        // Written element by element by this thread: it first-touches its own pages.
        let mut input: Vec<T> = (0..cin).map(|i| T::from_f64(value(rank, i))).collect();
        let mut output: Vec<T> = (0..if bcast { 0 } else { cout }).map(|_| zero).collect();
        let input_ptr = input.as_mut_ptr().cast();
        let output_ptr = if bcast {
            input_ptr
        } else {
            output.as_mut_ptr().cast()
        };
        let mut staging = vec![
            0u8;
            if args.staged && rank == 1 {
                STAGE_SLOTS * stage_chunk()
            } else {
                0
            }
        ];
        let mine = Bufs {
            input: input_ptr,
            output: output_ptr,
            staging: staging.as_mut_ptr(),
        };
        sh.slots.lock().unwrap()[rank] = Some(mine);
        sh.barrier.wait(rank);
        let peer = sh.slots.lock().unwrap()[1 - rank].expect("the peer published");
        // SAFETY (every call): `mine` and `peer` are this size's live buffers; the peer runs the
        // same iteration between the same two barriers (the contract of `Job::run`).
        let iteration = || unsafe { job.run(rank, mine, peer, &sh.staged) };
        let mut times = Vec::with_capacity(n);
        // Staged, the ring's counters pace the threads: no barriers between iterations.
        let paced = !job.staged;
        for i in 0..warm + n {
            if paced {
                sh.barrier.wait(rank);
            }
            let t0 = (rank == 0).then(Instant::now);
            iteration();
            if paced {
                sh.barrier.wait(rank);
            }
            if let Some(t0) = t0.filter(|_| i >= warm) {
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        if !paced {
            sh.barrier.wait(rank);
        }
        // SAFETY: between these barriers the peer does not touch this thread's buffers, which
        // are live and hold `cin` and `output.len()` elements of `T`.
        unsafe {
            let inp = std::slice::from_raw_parts_mut(mine.input.cast::<T>(), cin);
            inp.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = T::from_f64(value(rank, i)));
            std::slice::from_raw_parts_mut(mine.output.cast::<T>(), output.len()).fill(zero);
        }
        sh.barrier.wait(rank);
        iteration();
        sh.barrier.wait(rank);
        // SAFETY: the check iteration is over; nobody writes this thread's result (`cout` live
        // elements of `T`) until the next barrier.
        let got = unsafe { std::slice::from_raw_parts(mine.output.cast::<T>(), cout) };
        let wrong = count_wrong(coll, w, 0, rank, 2, cin, cout, false, got);
        sh.wrong.fetch_add(wrong, Ordering::Relaxed);
        sh.barrier.wait(rank);
        if let Some(tx) = &tx {
            let (median, min) = median_min(times);
            let _ = tx.send((job, median, min, sh.wrong.swap(0, Ordering::Relaxed)));
        }
        // The peer passed the last barrier after its last access: the buffers may go.
        drop((input, output, staging));
    }
}

impl Job {
    /// `(offset, len)` of half `rank` of `count` elements.
    fn half(count: usize, rank: usize) -> (usize, usize) {
        Blocks { count, parts: 2 }.block(rank)
    }

    /// One iteration of thread `rank`'s share (see the module docs).
    ///
    /// # Safety
    /// `mine` and `peer` hold live buffers, aligned for `dtype`, of `cin` input and `cout`
    /// output elements (broadcast: `output == input`; staged: rank 1's `staging` holds
    /// [`STAGE_SLOTS`] × [`stage_chunk`] bytes); the peer thread runs `run` with the roles
    /// swapped at the same time, with the same `staged` counters, and nothing else accesses the
    /// buffers.
    unsafe fn run(self, rank: usize, mine: Bufs, peer: Bufs, staged: &[Padded; 2]) {
        let Job {
            coll,
            dtype,
            op,
            cin,
            cout,
            staged: staged_job,
        } = self;
        let e = dtype.size();
        let at = |p: *mut u8, elem: usize| p.wrapping_add(elem * e);
        let chunk = chunk_elems(BLOCK, e);
        // SAFETY (every arm): all ranges lie inside their buffers (the caller's sizes). This
        // thread writes only elements of half / block `rank` (of its output and the peer's, or
        // of rank 1's broadcast buffer), the peer only those of `1 - rank`; inputs are only
        // read (broadcast: rank 0's buffer). The two sides of each copy are distinct buffers.
        // Staged: rank 0 writes a slot only after rank 1 counted the slot's last chunk out,
        // rank 1 reads it only after rank 0 counted it in (release / acquire on the counters),
        // and rank 1 alone writes its buffer.
        unsafe {
            let reduce_into = |dst: *mut u8, i: usize, len: usize| {
                reduce::reduce(dtype, op, dst, at(mine.input, i), at(peer.input, i), len);
                if op == ReduceOp::Avg {
                    reduce::finish_avg(dtype, dst, len, 2);
                }
            };
            match coll {
                Coll::AllReduce => {
                    let (off, len) = Job::half(cout, rank);
                    for (s, l) in rounds(len, chunk) {
                        reduce_into(at(mine.output, off + s), off + s, l);
                        copy::copy(at(peer.output, off + s), at(mine.output, off + s), l * e);
                    }
                }
                Coll::ReduceScatter => {
                    for (s, l) in rounds(cout, chunk) {
                        reduce_into(at(mine.output, s), rank * cout + s, l);
                    }
                }
                Coll::AllGather if cin * e >= copy::STREAM_MIN.bytes() => {
                    let o = rank * cin;
                    copy::copy(at(mine.output, o), mine.input, cin * e);
                    copy::copy(at(peer.output, o), mine.input, cin * e);
                }
                Coll::AllGather => {
                    for (s, l) in rounds(cin, chunk) {
                        let o = rank * cin + s;
                        copy::copy(at(mine.output, o), at(mine.input, s), l * e);
                        copy::copy(at(peer.output, o), at(mine.output, o), l * e);
                    }
                }
                Coll::Broadcast if staged_job => {
                    let ring = if rank == 1 {
                        mine.staging
                    } else {
                        peer.staging
                    };
                    let want = broadcast_pair::chunk_bytes(cout * e);
                    // Each side's counter is its own: it alone writes it.
                    let done = staged[rank].0.load(Ordering::Relaxed);
                    for (i, (s, l)) in rounds(cout, chunk_elems(want, e)).enumerate() {
                        let seq = done + i as u64;
                        let slot = ring.add((seq as usize % STAGE_SLOTS) * stage_chunk());
                        if rank == 0 {
                            // The slot's last chunk has been copied out.
                            staged[1].wait_for((seq + 1).saturating_sub(STAGE_SLOTS as u64));
                            copy::copy_to_peer(slot, at(mine.input, s), l * e);
                        } else {
                            staged[0].wait_for(seq + 1);
                            copy::copy(at(mine.input, s), slot, l * e);
                        }
                        staged[rank].0.store(seq + 1, Ordering::Release);
                    }
                }
                Coll::Broadcast => {
                    let (off, len) = Job::half(cout, rank);
                    let (root, other) = if rank == 0 {
                        (mine, peer)
                    } else {
                        (peer, mine)
                    };
                    copy::copy(at(other.input, off), at(root.input, off), len * e);
                }
                _ => unreachable!("ceiling: {coll:?} is rejected before"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_follow_peer_bench_and_median_is_the_middle() {
        assert_eq!(iterations(8, None, None), (1000, 250));
        assert_eq!(iterations(1 << 20, None, None), (256, 64));
        assert_eq!(iterations(64 << 20, None, None), (20, 5));
        assert_eq!(iterations(8, Some(40), None), (40, 10));
        assert_eq!(iterations(8, Some(0), Some(0)), (1, 0));
        assert_eq!(median_min(vec![3.0, 1.0, 2.0]), (2.0, 1.0));
        assert_eq!(median_min(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 1.0));
    }

    #[test]
    fn the_barrier_keeps_two_threads_in_step() {
        let (b, hits) = (SpinBarrier::default(), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for r in 0..2 {
                let (b, hits) = (&b, &hits);
                s.spawn(move || {
                    for i in 0..1000 {
                        hits.fetch_add(1, Ordering::Relaxed);
                        b.wait(r);
                        assert!(hits.load(Ordering::Relaxed) >= 2 * (i + 1));
                        b.wait(r);
                    }
                });
            }
        });
    }
}
