//! One intercepted collective: plan the split, enqueue the PCIe part on the side streams,
//! hand NCCL its part on the user's stream, join.
//!
//! Order on the user's stream: the PCIe part's start event is recorded *before* NCCL's kernel
//! (so the side streams do not wait for NCCL) and the join *after* it (so the two overlap).
//! Inside a group NCCL launches at `ncclGroupEnd`, so the join is deferred to then.
//!
//! How NCCL's part is expressed: allreduce, broadcast and reduce take a prefix of the buffer;
//! allgather and reduce-scatter take a prefix of every rank block, which no single NCCL
//! collective addresses, so allgather becomes grouped `ncclSend`/`ncclRecv` and reduce-scatter
//! grouped `ncclReduce`s (one per root).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use ampccl_multipath::pcie::{PcieKind, PcieOp, PcieRank};
use ampccl_runtime::cuda::StreamRef;

use crate::config::settings;
use ampccl_multipath::controller::{ExecStat, is_reference};
use ampccl_multipath::key::{MpOp, OpKey};
use ampccl_multipath::param::ParamValue;
use ampccl_multipath::planner::Split;
use ampccl_multipath::store::Decision;

use crate::domain::{self, CommState, Paths, Pcie};
use crate::guard::{self, Deferred, call_real};
use crate::nccl::{self, NcclResult};
use crate::real::{Missing, Real};

/// A collective call as NCCL received it.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    AllReduce {
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: c_int,
        op: c_int,
    },
    AllGather {
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: c_int,
    },
    ReduceScatter {
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: c_int,
        op: c_int,
    },
    Broadcast {
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: c_int,
        root: c_int,
    },
    Reduce {
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: c_int,
        op: c_int,
        root: c_int,
    },
}

impl Call {
    /// NCCL's function for the call, unless this NCCL lacks it.
    pub fn entry(&self, real: &Real) -> Result<(), Missing> {
        match self {
            Call::AllReduce { .. } => real.all_reduce().map(drop),
            Call::AllGather { .. } => real.all_gather().map(drop),
            Call::ReduceScatter { .. } => real.reduce_scatter().map(drop),
            Call::Broadcast { .. } => real.broadcast().map(drop),
            Call::Reduce { .. } => real.reduce().map(drop),
        }
    }

    /// What NCCL's part of a split call needs besides the call's own function ([`Call::part`]):
    /// allgather's is grouped sends and receives, reduce-scatter's grouped reduces. Without
    /// them the call is never split (this rank proposes NCCL alone).
    pub fn split_needs(&self, real: &Real) -> Result<(), Missing> {
        self.entry(real)?;
        match self {
            Call::AllGather { .. } => {
                real.group_start()?;
                real.group_end()?;
                real.send()?;
                real.recv().map(drop)
            }
            Call::ReduceScatter { .. } => {
                real.group_start()?;
                real.group_end()?;
                real.reduce().map(drop)
            }
            Call::AllReduce { .. } | Call::Broadcast { .. } | Call::Reduce { .. } => Ok(()),
        }
    }

    /// The whole call, to NCCL alone.
    ///
    /// # Safety
    /// The arguments are the application's, passed on unchanged.
    pub unsafe fn full(
        &self,
        real: &Real,
        comm: nccl::Comm,
        stream: nccl::Stream,
    ) -> Result<NcclResult, Missing> {
        // SAFETY: the application's own arguments, unchanged.
        call_real(|| unsafe {
            Ok(match *self {
                Call::AllGather {
                    send,
                    recv,
                    count,
                    dt,
                } => real.all_gather()?(send, recv, count, dt, comm, stream),
                Call::ReduceScatter {
                    send,
                    recv,
                    count,
                    dt,
                    op,
                } => real.reduce_scatter()?(send, recv, count, dt, op, comm, stream),
                Call::AllReduce { count, .. }
                | Call::Broadcast { count, .. }
                | Call::Reduce { count, .. } => self.span(real, (0, count), comm, stream)?,
            })
        })
    }

    /// The call on `n` elements of its buffers from byte `off` on, for the collectives whose
    /// rank block is the whole buffer (allreduce, broadcast, reduce); the blocked ones
    /// (allgather, reduce-scatter) have no such span and answer `ncclInternalError`.
    ///
    /// # Safety
    /// The application's buffers, at least `off` bytes plus `n` elements long.
    unsafe fn span(
        &self,
        real: &Real,
        (off, n): (usize, usize),
        comm: nccl::Comm,
        stream: nccl::Stream,
    ) -> Result<NcclResult, Missing> {
        // Offsets wrap instead of asserting an allocation: NCCL ignores the buffers a rank does
        // not use (a non-root's receive buffer of a reduce, which may be null).
        let send_at = |p: *const c_void| p.cast::<u8>().wrapping_add(off).cast::<c_void>();
        let recv_at = |p: *mut c_void| p.cast::<u8>().wrapping_add(off).cast::<c_void>();
        // SAFETY: the application's arguments, narrowed to a span inside its buffers.
        unsafe {
            Ok(match *self {
                Call::AllReduce {
                    send, recv, dt, op, ..
                } => real.all_reduce()?(send_at(send), recv_at(recv), n, dt, op, comm, stream),
                Call::Broadcast {
                    send,
                    recv,
                    dt,
                    root,
                    ..
                } => real.broadcast()?(send_at(send), recv_at(recv), n, dt, root, comm, stream),
                Call::Reduce {
                    send,
                    recv,
                    dt,
                    op,
                    root,
                    ..
                } => real.reduce()?(send_at(send), recv_at(recv), n, dt, op, root, comm, stream),
                Call::AllGather { .. } | Call::ReduceScatter { .. } => nccl::INTERNAL_ERROR,
            })
        }
    }

    /// The collective, as the multipath parameters name it.
    fn mp_op(&self) -> MpOp {
        match self {
            Call::AllReduce { .. } => MpOp::AllReduce,
            Call::AllGather { .. } => MpOp::AllGather,
            Call::ReduceScatter { .. } => MpOp::ReduceScatter,
            Call::Broadcast { .. } => MpOp::Broadcast,
            Call::Reduce { .. } => MpOp::Reduce,
        }
    }

    fn dt(&self) -> c_int {
        match *self {
            Call::AllReduce { dt, .. }
            | Call::AllGather { dt, .. }
            | Call::ReduceScatter { dt, .. }
            | Call::Broadcast { dt, .. }
            | Call::Reduce { dt, .. } => dt,
        }
    }

    /// The reduction operator (`Sum` for collectives without one).
    fn op(&self) -> Option<ampccl_runtime::ReduceOp> {
        match *self {
            Call::AllReduce { op, .. }
            | Call::ReduceScatter { op, .. }
            | Call::Reduce { op, .. } => nccl::redop(op),
            _ => Some(ampccl_runtime::ReduceOp::Sum),
        }
    }

    /// The PCIe part for rank blocks split at `fast` with `pcie` elements each.
    fn pcie_op(
        &self,
        dtype: ampccl_runtime::DataType,
        op: ampccl_runtime::ReduceOp,
        fast: usize,
        pcie: usize,
    ) -> PcieOp {
        let (kind, send, recv, block) = match *self {
            Call::AllReduce {
                send, recv, count, ..
            } => (PcieKind::AllReduce, send, recv, count),
            Call::AllGather {
                send, recv, count, ..
            } => (PcieKind::AllGather, send, recv, count),
            Call::ReduceScatter {
                send, recv, count, ..
            } => (PcieKind::ReduceScatter, send, recv, count),
            Call::Broadcast {
                send,
                recv,
                count,
                root,
                ..
            } => (
                PcieKind::Broadcast {
                    root: root as usize,
                },
                send,
                recv,
                count,
            ),
            Call::Reduce {
                send,
                recv,
                count,
                root,
                ..
            } => (
                PcieKind::Reduce {
                    root: root as usize,
                },
                send,
                recv,
                count,
            ),
        };
        PcieOp {
            kind,
            dtype,
            op,
            send: send as u64,
            recv: recv as u64,
            block,
            start: fast,
            len: pcie,
        }
    }

    /// Elements per rank block, and the bytes the call moves (the larger of its buffers).
    fn block(&self, nranks: usize, es: usize) -> (usize, usize) {
        match *self {
            Call::AllReduce { count, .. }
            | Call::Broadcast { count, .. }
            | Call::Reduce { count, .. } => (count, count * es),
            Call::AllGather { count, .. } | Call::ReduceScatter { count, .. } => {
                (count, count * es * nranks)
            }
        }
    }

    /// NCCL's part of a split call: the call on elements `start..start + len` of every block.
    /// An allgather also copies its own span into its block of the output (on `user`, through
    /// `rank`'s device; without a PCIe rank the call is failing anyway and the copy is left).
    ///
    /// # Safety
    /// The application's buffers, as NCCL was given them; the span lies inside every block.
    unsafe fn part(
        &self,
        real: &Real,
        rank: Option<&PcieRank>,
        st: &CommState,
        (start, len, es): (usize, usize, usize),
        (comm, stream): (nccl::Comm, nccl::Stream),
    ) -> Result<NcclResult, Missing> {
        let n = st.nranks;
        let off = start * es;
        // SAFETY: the spans lie inside the application's buffers.
        call_real(|| unsafe {
            match *self {
                Call::AllReduce { .. } | Call::Broadcast { .. } | Call::Reduce { .. } => {
                    self.span(real, (off, len), comm, stream)
                }
                Call::AllGather {
                    send,
                    recv,
                    count,
                    dt,
                } => {
                    let block = |p: usize| recv.cast::<u8>().add(p * count * es + off);
                    let mine = send.cast::<u8>().add(off).cast::<c_void>();
                    let own = rank.map_or(Ok(()), |rank| {
                        rank.copy_on(
                            StreamRef::from_raw(stream),
                            block(st.rank) as u64,
                            mine as u64,
                            len * es,
                        )
                    });
                    if let Err(e) = own {
                        tracing::error!("ampccl: allgather local copy: {e}");
                        return Ok(nccl::INTERNAL_ERROR);
                    }
                    let (send, recv) = (real.send()?, real.recv()?);
                    grouped(real, |first_error| {
                        for p in (0..n).filter(|&p| p != st.rank) {
                            first_error(send(mine, len, dt, p as c_int, comm, stream));
                            first_error(recv(block(p).cast(), len, dt, p as c_int, comm, stream));
                        }
                    })
                }
                Call::ReduceScatter {
                    send,
                    recv,
                    count,
                    dt,
                    op,
                } => {
                    let reduce = real.reduce()?;
                    grouped(real, |first_error| {
                        let dst = recv.cast::<u8>().add(off).cast::<c_void>();
                        for r in 0..n {
                            let src = send.cast::<u8>().add(r * count * es + off).cast::<c_void>();
                            first_error(reduce(src, dst, len, dt, op, r as c_int, comm, stream));
                        }
                    })
                }
            }
        })
    }
}

/// Runs the NCCL calls `body` makes inside one group; the first failure wins.
unsafe fn grouped(
    real: &Real,
    body: impl FnOnce(&mut dyn FnMut(NcclResult)),
) -> Result<NcclResult, Missing> {
    let (start, end) = (real.group_start()?, real.group_end()?);
    // SAFETY: plain NCCL group calls around the application's operations.
    let mut r = unsafe { start() };
    if r != nccl::SUCCESS {
        return Ok(r);
    }
    body(&mut |x| {
        if r == nccl::SUCCESS {
            r = x;
        }
    });
    // SAFETY: closes the group opened above.
    let end = unsafe { end() };
    Ok(if r == nccl::SUCCESS { end } else { r })
}

/// Runs `call` on `comm`, split when the domain's decision for it says so.
///
/// Every call moving at least `AMPCCL_MIN_MSG_SIZE` bytes takes the next index of the
/// communicator's call sequence (the same on every rank) and goes through the decision ring:
/// this rank proposes the split its controller's table gives (or fast-only, when its PCIe path
/// cannot be used), and every rank adopts the first proposal made for that index.
///
/// # Safety
/// The arguments are the application's, as NCCL would get them.
pub unsafe fn run(
    real: &Real,
    call: Call,
    comm: nccl::Comm,
    stream: nccl::Stream,
) -> Result<NcclResult, Missing> {
    // SAFETY: forwarded from the caller.
    let full = || unsafe { call.full(real, comm, stream) };
    let Some(st) = domain::lookup(comm) else {
        return full();
    };
    let (Some(dtype), Some(op)) = (nccl::dtype(call.dt()), call.op()) else {
        return full();
    };
    let es = dtype.size();
    let (block, bytes) = call.block(st.nranks, es);
    let s = settings();
    if bytes < s.rules.min_msg_bytes {
        return full();
    }
    if matches!(st.lock().pcie, Pcie::Pending) {
        // SAFETY: `comm` is registered, so NCCL made it.
        unsafe { setup(real, comm, &st) };
    }
    let mut guard = st.lock();
    let p = &mut *guard;
    collect(p, st.rank);
    let Some(store) = p.store.as_ref() else {
        return full();
    };
    let key = OpKey::new(call.mp_op(), bytes as u64, dtype);
    let fingerprint = Decision::fingerprint(call.mp_op(), dtype, block as u64);
    let user = StreamRef::from_raw(stream);
    // A split whose NCCL part this NCCL cannot express is never proposed.
    let usable = call.split_needs(real).is_ok()
        && st.can_split(&mut p.pcie)
        && match &p.pcie {
            Pcie::Ready { rank, .. } => matches!(rank.capturing(user), Ok(false)),
            _ => false,
        };
    // The controller's reference calls run on NCCL alone whatever the table says (counted
    // after the warm-up calls, identically on every rank).
    let nth = p.calls.entry(key).or_insert(0);
    let reference = nth
        .checked_sub(u64::from(domain::WARMUP_CALLS))
        .is_some_and(|n| is_reference(p.initial.reference_every(), n));
    *nth += 1;
    let proposal = if usable && !reference {
        let param = match store.read_param(&key).ok().flatten() {
            Some(param) => param,
            None => {
                let param = match p.initial.name() {
                    // A static split is the user's: exactly as given.
                    "static" => p.initial.initial(&key),
                    _ => prior(&key, st.nranks, p.initial.initial(&key)),
                };
                if st.rank == 0 {
                    // The controller starts from the prior, not from its generic initial split.
                    let _ = store.write_param(&key, &param);
                }
                param
            }
        };
        Decision::from_param(&param, fingerprint)
    } else {
        Decision::fast_only(fingerprint)
    };
    let index = p.next_call;
    p.next_call += 1;
    let decision = match store.decide(index, proposal) {
        Ok(d) => d,
        Err(e) => {
            log_once(&format!(
                "no agreed split for call {index}, NCCL alone: {e}"
            ));
            return full();
        }
    };
    tracing::debug!(
        target: "ampccl::split",
        rank = st.rank,
        call = index,
        op = call.mp_op().name(),
        bytes,
        alpha = decision.alpha(),
        pcie = decision.use_pcie,
        "decision");
    let split = if decision.use_pcie {
        s.rules.split(block, es, bytes, decision.alpha())
    } else {
        Split::fast_only(block)
    };
    let cannot = match &p.pcie {
        _ if !split.uses_pcie() => None,
        Pcie::Ready { .. } if usable => None,
        Pcie::Ready { .. } => {
            Some("its stream is being captured (or its capture state is unknown)")
        }
        Pcie::Pending | Pcie::Off { .. } => Some("its PCIe path is off"),
    };
    if let Some(why) = cannot {
        // NCCL still gets the part the ranks agreed on, so that the peers' NCCL parts find
        // theirs; the failure is reported asynchronously (see `CommState::break_pcie`).
        st.break_pcie(
            &mut p.pcie,
            format!("the ranks agreed on a split of call {index} this rank cannot make: {why}"),
        );
        // SAFETY: the buffers are the application's, sized as the collective implies.
        return unsafe { call.part(real, None, &st, (0, split.fast, es), (comm, stream)) };
    }
    let Pcie::Ready { rank, .. } = &mut p.pcie else {
        return full();
    };
    let mut done = Vec::new();
    // Every call is timed, those on NCCL alone too: they are the controller's reference.
    let timed = rank.time_call(user, index, split.uses_pcie(), &mut done);
    let r = if split.uses_pcie() {
        let pop = call.pcie_op(dtype, op, split.fast, split.pcie);
        // The peers' pipelines already wait for this rank's chunks, and their NCCL parts for
        // this rank's: a PCIe part that fails here cannot be redone by NCCL alone (NCCL's call
        // sequence would differ between ranks). NCCL gets its part all the same, the path is
        // broken for every rank, and the failure is reported asynchronously, as NCCL reports
        // errors found after a call was enqueued (the half-recorded timing is dropped when its
        // slot is collected).
        let forked = rank.fork(&pop, user, timed);
        // NCCL's part first, so that its kernels run while the host enqueues the pipeline.
        // SAFETY: the buffers are the application's, sized as the collective implies.
        let r = unsafe { call.part(real, Some(rank), &st, (0, split.fast, es), (comm, stream)) };
        // SAFETY: as above.
        let enqueued = forked.and_then(|f| unsafe { rank.enqueue(&pop, f) });
        if let Err(e) = enqueued {
            // Timings of earlier calls collected above still count.
            absorb(p, st.rank, &done);
            st.break_pcie(
                &mut p.pcie,
                format!("the PCIe part of call {index} failed: {e}"),
            );
            // The user's stream still waits for what was enqueued (it writes the output), and
            // for the release after it.
            return Ok(match join_now_or_later(&p.pcie, comm, stream) {
                nccl::SUCCESS => r?,
                e => e,
            });
        }
        r?
    } else {
        full()?
    };
    if let Some(t) = timed {
        let _ = rank.time_fast_end(t, user);
        // Bytes each path moves: its elements per block times the blocks the call moves.
        let blocks = bytes / (block * es);
        let moved = |n: usize| (n * es * blocks) as u64;
        p.inflight
            .insert(index, (key, moved(split.fast), moved(split.pcie)));
    }
    absorb(p, st.rank, &done);
    if !split.uses_pcie() {
        return Ok(r);
    }
    Ok(match join_now_or_later(&p.pcie, comm, stream) {
        nccl::SUCCESS => r,
        e => e,
    })
}

/// Makes `stream` wait for the PCIe part's side streams, at once or, inside a group, at its
/// end ([`join_deferred`]).
fn join_now_or_later(pcie: &Pcie, comm: nccl::Comm, stream: nccl::Stream) -> NcclResult {
    if guard::in_group() {
        guard::defer(Deferred::Join(comm, stream));
        return nccl::SUCCESS;
    }
    join(pcie, stream)
}

/// Makes `stream` wait for the side streams of `pcie` (on or retired).
fn join(pcie: &Pcie, stream: nccl::Stream) -> NcclResult {
    if let Some(rank) = pcie.rank()
        && let Err(e) = rank.join(StreamRef::from_raw(stream))
    {
        tracing::error!("ampccl: joining the PCIe part failed: {e}");
        return nccl::INTERNAL_ERROR;
    }
    nccl::SUCCESS
}

/// The first split of a key the table does not hold yet (adaptive controllers): the
/// controller's initial split (tuned for 2 GPUs), with the PCIe share of reductions scaled by
/// the bytes their PCIe part moves H2D per byte on 2 GPUs over those it moves on `nranks`:
/// `1 / (nranks − 1)` for reduce-scatter and reduce (they fetch every peer's chunk), and
/// `nranks / (2 (nranks − 1))` for allreduce (reduce-scatter, then allgather, through host
/// memory).
fn prior(key: &OpKey, nranks: usize, initial: ParamValue) -> ParamValue {
    let n = nranks as f64;
    let scale = match key.op {
        _ if nranks <= 2 => return initial,
        MpOp::AllReduce => n / (2.0 * (n - 1.0)),
        MpOp::ReduceScatter | MpOp::Reduce => 1.0 / (n - 1.0),
        _ => return initial,
    };
    initial.with_alpha(1.0 - (1.0 - initial.effective_alpha()) * scale)
}

/// Feeds the timings of completed calls to the parameter store (rank 0 then folds every
/// rank's measurements into the table) and to the report.
pub fn collect(p: &mut Paths, rank: usize) {
    let mut done = Vec::new();
    if let Pcie::Ready { rank, .. } = &mut p.pcie {
        rank.poll_timings(&mut done);
    }
    absorb(p, rank, &done);
}

fn absorb(p: &mut Paths, rank: usize, done: &[ampccl_multipath::pcie::CallTiming]) {
    for t in done {
        let Some((key, fast_bytes, pcie_bytes)) = p.inflight.remove(&t.tag) else {
            continue;
        };
        let stat = ExecStat {
            fast_time_us: f64::from(t.fast_ms) * 1e3,
            pcie_time_us: f64::from(t.pcie_ms) * 1e3,
            fast_bytes,
            pcie_bytes,
            success: true,
        };
        let seen = p.seen.entry(key).or_insert(0);
        *seen += 1;
        if *seen > domain::WARMUP_CALLS
            && let Some(store) = &p.store
            && let Err(e) = store.publish_stat(&key, t.tag, &stat)
        {
            tracing::debug!("ampccl: publishing a measurement: {e}");
        }
        p.tally.add(
            key,
            fast_bytes as f64 / (fast_bytes + pcie_bytes).max(1) as f64,
            t,
        );
    }
    if rank == 0
        && let (Some(store), Some(agg)) = (&p.store, p.aggregator.as_mut())
        && let Err(e) = agg.poll(store)
    {
        tracing::debug!("ampccl: updating the split table: {e}");
    }
}

/// Sets up `comm`'s PCIe path (NCCL must have finished making it). The path needs
/// `ncclCommCuDevice` (its device) and `ncclCommGetAsyncError` (through which a failed PCIe
/// part is reported): without either it stays off.
///
/// # Safety
/// `comm` must be a communicator NCCL made.
pub unsafe fn setup(real: &Real, comm: nccl::Comm, st: &CommState) {
    st.setup(device(real, comm));
}

/// The CUDA device of `comm`, or why the PCIe path cannot have one.
fn device(real: &Real, comm: nccl::Comm) -> Result<c_int, String> {
    let lacks = |Missing(name)| format!("the real NCCL lacks {name}");
    real.async_error().map_err(lacks)?;
    let cu_device = real.cu_device().map_err(lacks)?;
    let mut dev: c_int = -1;
    // SAFETY: `comm` is a communicator NCCL made; `dev` is a valid out-parameter.
    match call_real(|| unsafe { cu_device(comm, &mut dev) }) {
        nccl::SUCCESS => Ok(dev),
        r => Err(format!("ncclCommCuDevice failed ({r})")),
    }
}

/// Applies deferred joins for `comm`.
pub fn join_deferred(comm: nccl::Comm, stream: nccl::Stream) -> NcclResult {
    let Some(st) = domain::lookup(comm) else {
        return nccl::SUCCESS;
    };
    join(&st.lock().pcie, stream)
}

fn log_once(msg: &str) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!("ampccl: {msg}");
    } else {
        tracing::debug!("ampccl: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_start_with_a_smaller_pcie_share_on_more_gpus() {
        let init = ParamValue::split(0.9);
        let ar = OpKey::new(MpOp::AllReduce, 1 << 30, ampccl_runtime::DataType::F32);
        let ag = OpKey::new(MpOp::AllGather, 1 << 30, ampccl_runtime::DataType::F32);
        assert!((prior(&ar, 2, init).effective_alpha() - 0.9).abs() < 1e-6);
        let rs = OpKey::new(MpOp::ReduceScatter, 1 << 30, ampccl_runtime::DataType::F32);
        assert!((prior(&ar, 4, init).effective_alpha() - (1.0 - 0.1 * 4.0 / 6.0)).abs() < 1e-6);
        assert!((prior(&rs, 4, init).effective_alpha() - (1.0 - 0.1 / 3.0)).abs() < 1e-6);
        assert!((prior(&ag, 4, init).effective_alpha() - 0.9).abs() < 1e-6);
    }

    #[test]
    fn a_missing_function_keeps_off_only_the_splits_that_need_it() {
        let (send, recv, count, dt, op) = (std::ptr::null(), std::ptr::null_mut(), 1, 7, 0);
        let all_reduce = Call::AllReduce {
            send,
            recv,
            count,
            dt,
            op,
        };
        let all_gather = Call::AllGather {
            send,
            recv,
            count,
            dt,
        };
        let reduce_scatter = Call::ReduceScatter {
            send,
            recv,
            count,
            dt,
            op,
        };
        // NCCL before 2.7: no ncclSend / ncclRecv.
        let old = Real::with_only(&[
            "ncclAllReduce",
            "ncclAllGather",
            "ncclReduceScatter",
            "ncclReduce",
            "ncclGroupStart",
            "ncclGroupEnd",
        ]);
        assert_eq!(all_reduce.split_needs(&old), Ok(()));
        assert_eq!(reduce_scatter.split_needs(&old), Ok(()));
        assert_eq!(all_gather.entry(&old), Ok(()), "still passes through");
        assert_eq!(all_gather.split_needs(&old), Err(Missing("ncclSend")));
        // No group calls: both grouped NCCL parts are off, the others are not.
        let ungrouped = Real::with_only(&["ncclAllReduce", "ncclReduceScatter", "ncclReduce"]);
        assert_eq!(
            reduce_scatter.split_needs(&ungrouped),
            Err(Missing("ncclGroupStart"))
        );
        assert_eq!(all_reduce.split_needs(&ungrouped), Ok(()));
        assert_eq!(all_gather.entry(&ungrouped), Err(Missing("ncclAllGather")));
    }

    #[test]
    fn the_pcie_path_needs_the_device_and_the_async_error() {
        let comm = std::ptr::null_mut();
        let no_async = Real::with_only(&["ncclCommCuDevice"]);
        assert_eq!(
            device(&no_async, comm),
            Err("the real NCCL lacks ncclCommGetAsyncError".into())
        );
        let no_device = Real::with_only(&["ncclCommGetAsyncError"]);
        assert_eq!(
            device(&no_device, comm),
            Err("the real NCCL lacks ncclCommCuDevice".into())
        );
    }
}
