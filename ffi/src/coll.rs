//! The collective and point-to-point entry points (NCCL's signatures, host memory).
//!
//! Each call checks its arguments (errors are returned at once), then enqueues the operation
//! on the stream and returns without waiting, as NCCL does; inside a group it is collected
//! instead (see `group`). Buffers must stay valid, and outputs untouched, until the operation
//! completes (`ampcclStreamSynchronize`, `ampcclEventSynchronize`, `ampcclCommSynchronize`).

use std::ffi::{c_int, c_void};

use ampccl_native::op::OpKind;
use ampccl_native::{DataType, OpSpec, RawOp, ReduceOp};

use crate::comm::comm_ref;
use crate::error::{FfiResult, guard_keep, invalid};
use crate::group;
use crate::stream::{Batch, Ops, submit};
use crate::types::ampcclResult_t::{self, *};
use crate::types::*;

fn dtype(v: ampcclDataType_raw) -> FfiResult<DataType> {
    data_type(v).ok_or_else(|| {
        invalid(format!(
            "datatype {v} is not an ampcclDataType_t (0 ampcclInt8 .. 9 ampcclBfloat16)"
        ))
    })
}

fn redop(v: ampcclRedOp_raw) -> FfiResult<ReduceOp> {
    reduce_op(v).ok_or_else(|| {
        invalid(format!(
            "reduction {v} is not an ampcclRedOp_t (0 ampcclSum .. 4 ampcclAvg)"
        ))
    })
}

fn rank_arg(what: &str, v: c_int) -> FfiResult<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} {v} is negative")))
}

/// Checks and enqueues (or collects) one operation.
///
/// # Safety
/// `comm` and `stream` are NULL or live handles; the buffers follow the collective's contract.
unsafe fn issue(
    comm: ampcclComm_t,
    stream: ampcclStream_t,
    spec: OpSpec,
    send: *const c_void,
    recv: *mut c_void,
) -> FfiResult<ampcclResult_t> {
    // SAFETY: forwarded from the caller.
    let h = unsafe { comm_ref(comm)? };
    let c = h.shared.ready()?;
    let op = RawOp {
        spec,
        send: send.cast(),
        recv: recv.cast(),
    };
    if group::active() {
        // Submitted at the group's end: refuse bad arguments here, at the call that made them.
        c.check_raw(&op)?;
        group::push(h.shared.clone(), c, stream, op);
        return Ok(ampcclSuccess);
    }
    // Submitted now: the submission makes the same checks before it queues anything.
    let b = Batch {
        shared: h.shared.clone(),
        comm: c,
        ops: Ops::One(op),
    };
    // SAFETY: forwarded from the caller.
    unsafe { submit(stream, &[b])? };
    Ok(ampcclSuccess)
}

/// `recvbuff[i]` = `op` over ranks of `sendbuff[i]`, `count` elements (in place when the
/// buffers are equal).
///
/// # Safety
/// `comm`/`stream` are live handles (`stream` may be NULL); the buffers hold `count` elements
/// and stay valid until the operation completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ampcclDataType_raw,
    op: ampcclRedOp_raw,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclAllReduce", || {
        let spec = OpSpec::new(OpKind::AllReduce, count, dtype(datatype)?).op(redop(op)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, recvbuff) }
    })
}

/// `recvbuff` (`nranks * sendcount` elements) = the ranks' `sendbuff` in rank order (in place
/// when `sendbuff == recvbuff + rank * sendcount`).
///
/// # Safety
/// As [`ampcclAllReduce`], with the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ampcclDataType_raw,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclAllGather", || {
        let spec = OpSpec::new(OpKind::AllGather, sendcount, dtype(datatype)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, recvbuff) }
    })
}

/// `recvbuff` (`recvcount` elements) = block `rank` of `op` over ranks of `sendbuff`
/// (`nranks * recvcount` elements; in place when `recvbuff == sendbuff + rank * recvcount`).
///
/// # Safety
/// As [`ampcclAllReduce`], with the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ampcclDataType_raw,
    op: ampcclRedOp_raw,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclReduceScatter", || {
        let spec = OpSpec::new(OpKind::ReduceScatter, recvcount, dtype(datatype)?).op(redop(op)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, recvbuff) }
    })
}

/// Copies `sendbuff` of `root` into every rank's `recvbuff` (`sendbuff` is read on `root`
/// only).
///
/// # Safety
/// As [`ampcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ampcclDataType_raw,
    root: c_int,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclBroadcast", || {
        let spec =
            OpSpec::new(OpKind::Broadcast, count, dtype(datatype)?).root(rank_arg("root", root)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, recvbuff) }
    })
}

/// `recvbuff` on `root` = `op` over ranks of `sendbuff` (`recvbuff` is written on `root`
/// only and may be NULL elsewhere).
///
/// # Safety
/// As [`ampcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ampcclDataType_raw,
    op: ampcclRedOp_raw,
    root: c_int,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclReduce", || {
        let spec = OpSpec::new(OpKind::Reduce, count, dtype(datatype)?)
            .op(redop(op)?)
            .root(rank_arg("root", root)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, recvbuff) }
    })
}

/// Block `j` (`count` elements) of `sendbuff` goes to rank `j`; block `j` of `recvbuff` comes
/// from rank `j` (both hold `nranks * count` elements).
///
/// # Safety
/// As [`ampcclAllReduce`], with the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ampcclDataType_raw,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclAlltoAll", || {
        let spec = OpSpec::new(OpKind::AllToAll, count, dtype(datatype)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, recvbuff) }
    })
}

/// Sends `count` elements to `peer`, matched with `peer`'s `ampcclRecv` in issue order. Sends
/// and receives that must progress together go in one group.
///
/// # Safety
/// As [`ampcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ampcclDataType_raw,
    peer: c_int,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclSend", || {
        let spec = OpSpec::new(OpKind::Send, count, dtype(datatype)?).root(rank_arg("peer", peer)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, sendbuff, std::ptr::null_mut()) }
    })
}

/// Receives exactly `count` elements from `peer`.
///
/// # Safety
/// As [`ampcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ampcclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ampcclDataType_raw,
    peer: c_int,
    comm: ampcclComm_t,
    stream: ampcclStream_t,
) -> ampcclResult_t {
    guard_keep("ampcclRecv", || {
        let spec = OpSpec::new(OpKind::Recv, count, dtype(datatype)?).root(rank_arg("peer", peer)?);
        // SAFETY: forwarded from the caller.
        unsafe { issue(comm, stream, spec, std::ptr::null(), recvbuff) }
    })
}
