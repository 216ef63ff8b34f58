//! Groups: several calls submitted together run concurrently, each on a lane (a stream of the
//! communicator's group streams), joined back into the caller's stream. Planning pairs sends
//! to this rank itself with receives from it (local copies) and keeps every other call for its
//! executor; the lanes then place receives that share the window on one stream.

use ampccl_runtime::{Error, Result};

use ampccl_runtime::stream::Stream;
use ampccl_runtime::task::{CopyTo, Task};

use super::{Call, CommInner, Wait};
use crate::op::OpKind;

/// One unit of a submission: a call orchestrated by its executor, or a send to this rank
/// itself with its matching receive (indices into the calls), done as a local copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Job {
    Call(usize),
    SelfCopy { send: usize, recv: usize },
}

/// Pairs the `n`-th send to this rank itself with the `n`-th receive from it (their sizes must
/// match) and keeps every other call as is; an unpaired one is an error, found before anything
/// is queued.
pub(super) fn plan(rank: usize, calls: &[Call]) -> Result<Vec<Job>> {
    let to_self = |kind: OpKind| {
        calls
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.p.kind == kind && c.p.root == rank)
            .map(|(i, _)| i)
    };
    let (sends, recvs): (Vec<_>, Vec<_>) = (
        to_self(OpKind::Send).collect(),
        to_self(OpKind::Recv).collect(),
    );
    if sends.len() != recvs.len() {
        return Err(Error::InvalidArgument(format!(
            "{} send(s) to this rank ({rank}) itself but {} receive(s) from it: a send to \
             oneself needs a group with the matching recv",
            sends.len(),
            recvs.len()
        )));
    }
    let mut jobs = Vec::with_capacity(calls.len());
    for (&send, &recv) in sends.iter().zip(&recvs) {
        let (sb, rb) = (calls[send].input.len, calls[recv].output.len);
        if sb != rb {
            return Err(Error::InvalidArgument(format!(
                "a send of {sb} bytes to this rank ({rank}) itself is matched with a receive \
                 of {rb} bytes"
            )));
        }
        jobs.push(Job::SelfCopy { send, recv });
    }
    let paired = |i: usize| sends.contains(&i) || recvs.contains(&i);
    jobs.extend((0..calls.len()).filter(|&i| !paired(i)).map(Job::Call));
    Ok(jobs)
}

impl CommInner {
    /// Queues the `jobs` of a group's `calls` (from [`plan`]) onto lanes, each started after
    /// `after_prior` was applied to it, and makes `stream` wait for all of them.
    pub(super) fn run_group(
        &self,
        stream: &Stream,
        calls: &[Call],
        jobs: &[Job],
        after_prior: impl Fn(&Stream),
    ) -> Result<()> {
        let c = self;
        // Without cross-memory attach every receive lands in the one CCL input buffer, so
        // the group's receives take turns on one stream (sends, which read user memory,
        // still run concurrently; a receive waits only for its matching send, which waits
        // only for that receive: no cycle). With it they land in user memory directly.
        let serial_recv = !c.transport.user_mem_links();
        let mut lanes = Vec::with_capacity(jobs.len());
        let (mut n, mut recv_lane) = (0, None);
        for job in jobs {
            let is_recv = matches!(*job, Job::Call(i) if calls[i].p.kind == OpKind::Recv);
            let lane = match recv_lane {
                Some(l) if serial_recv && is_recv => l,
                _ => {
                    n += 1;
                    if serial_recv && is_recv {
                        recv_lane = Some(n - 1);
                    }
                    n - 1
                }
            };
            lanes.push(lane);
        }
        let mut streams = c.group_streams.lock().unwrap_or_else(|e| e.into_inner());
        while streams.len() < n {
            streams.push(c.engine.stream());
        }
        for s in &streams[..n] {
            after_prior(s);
        }
        let mut r = Ok(());
        for (&job, &lane) in jobs.iter().zip(&lanes) {
            r = c.run_job(&streams[lane], calls, job);
            if r.is_err() {
                break;
            }
        }
        for s in &streams[..n] {
            stream.wait_event(&s.record());
        }
        r
    }

    /// Queues one job onto `stream` (the caller, `submit`, guarantees the calls' regions stay
    /// valid until the stream gets past it).
    fn run_job(&self, stream: &Stream, calls: &[Call], job: Job) -> Result<()> {
        match job {
            Job::Call(i) => self.orchestrate(stream, &calls[i], Wait::Later),
            Job::SelfCopy { send, recv } => {
                let (src, dst) = (calls[send].input, calls[recv].output);
                if src.len > 0 && src.ptr != dst.ptr {
                    // SAFETY: both regions hold `src.len` bytes (checked by `plan`) and stay
                    // valid until the operation completes (the contract of `submit`); the
                    // typed API borrows them as `&[T]` and `&mut [T]`, so they do not overlap.
                    unsafe {
                        stream.enqueue(Task::Copy {
                            dst: dst.ptr,
                            src: src.ptr,
                            len: src.len,
                            to: CopyTo::Local,
                        })
                    };
                }
                Ok(())
            }
        }
    }
}
