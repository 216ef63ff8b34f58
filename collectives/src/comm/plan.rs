//! Planning a submission: which calls run through their executors, and which sends to this
//! rank itself pair with receives from it and become local copies.

use ampccl_runtime::{Error, Result};

use super::Call;
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
