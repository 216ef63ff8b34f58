//! Negative tests: hand-written executors with one bug each must be rejected with the right
//! error; their correct twins (and a multi-stream, an ack and a Send/Recv executor) pass.

use ampccl_runtime::{DataType, ReduceOp, Result};

use super::*;
use crate::resource::{AlgResourceRequest, BufKind, CopyTo, MAIN, Mem};

type Run = fn(&OpParam, &mut AlgResourceResponse<'_>) -> Result<()>;

/// An executor from a resource request and an orchestration function.
struct Custom(fn(&OpParam) -> AlgResourceRequest, Run);

impl Executor for Custom {
    fn calc_res_request(&self, p: &OpParam) -> AlgResourceRequest {
        self.0(p)
    }
    fn orchestrate(&self, p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
        self.1(p, res)
    }
}

fn mesh(p: &OpParam) -> AlgResourceRequest {
    AlgResourceRequest::mesh(p.rank, p.world)
}

fn ring(p: &OpParam) -> AlgResourceRequest {
    AlgResourceRequest::ring(p.rank, p.world)
}

/// Mesh with one side stream and one notify.
fn mesh_2s(p: &OpParam) -> AlgResourceRequest {
    AlgResourceRequest {
        stream_num: 1,
        notify_num: 1,
        ..mesh(p)
    }
}

fn ar(world: usize, count: usize, op: ReduceOp) -> OpParam {
    OpParam {
        kind: OpKind::AllReduce,
        count,
        dtype: DataType::F32,
        op,
        root: 0,
        rank: 0,
        world,
        in_place: false,
        seq: 0,
    }
}

fn cfg() -> VerifyConfig {
    VerifyConfig {
        ccl_size: 4096,
        ..Default::default()
    }
}

fn slot(p: &OpParam, r: usize) -> Mem {
    Mem::of(BufKind::CclIn).add(r * p.count * p.elem())
}

const IN: Mem = Mem::of(BufKind::UserIn);
const OUT: Mem = Mem::of(BufKind::UserOut);

/// One-shot allreduce with knobs for its bugs: `skip` one reduce, `extra` reduce, `avg`.
fn one_shot(p: &OpParam, res: &mut AlgResourceResponse<'_>, bug: &str) -> Result<()> {
    let (nb, me, s) = (
        p.count * p.elem(),
        p.rank,
        if bug == "side_unsynced" { 1 } else { MAIN },
    );
    res.tasks.copy(MAIN, slot(p, me), IN, nb)?;
    let peers = || (1..p.world).map(|d| (me + d) % p.world);
    for q in peers() {
        res.tasks.rx_async(MAIN, q, slot(p, q), nb)?;
    }
    for q in peers() {
        let len = if bug == "short" { nb - p.elem() } else { nb };
        res.tasks.tx_async(MAIN, q, slot(p, me), len)?;
    }
    for q in peers() {
        res.tasks.rx_wait_done(MAIN, q, nb)?;
        if bug != "no_tx_done" {
            res.tasks.tx_wait_done(MAIN, q)?;
        }
    }
    match bug {
        "side_unsynced" | "no_record" => {
            // The reduction on the side stream, after main's record: or without it.
            if bug == "side_unsynced" {
                res.tasks.record(MAIN, 0)?;
            }
            res.tasks.wait(1, 0)?;
        }
        "unsynced" => {}
        "two_records" => {
            res.tasks.record(MAIN, 0)?;
            res.tasks.record(MAIN, 0)?;
            res.tasks.wait(1, 0)?;
        }
        _ => {}
    }
    let s = if bug == "unsynced" || bug == "two_records" {
        1
    } else {
        s
    };
    let t = p.dtype;
    res.tasks
        .reduce(s, t, p.op, OUT, slot(p, 0), slot(p, 1), p.count)?;
    let last = if bug == "skip" { p.world - 1 } else { p.world };
    for q in 2..last {
        res.tasks
            .reduce(s, t, p.op, OUT, OUT, slot(p, q), p.count)?;
    }
    if bug == "extra" {
        res.tasks
            .reduce(s, t, p.op, OUT, OUT, slot(p, me), p.count)?;
    }
    if p.op == ReduceOp::Avg && bug != "no_avg" {
        res.tasks.finish_avg(s, t, OUT, p.count, p.world)?;
    }
    Ok(())
}

fn expect(exec: &dyn Executor, p: &OpParam, c: &VerifyConfig, f: fn(&VerifyError) -> bool) {
    match verify(exec, p, c) {
        Err(e) if f(&e) => eprintln!("rejected as expected: {e}"),
        other => panic!("unexpected outcome: {other:?}"),
    }
}

fn wrong(e: &VerifyError) -> bool {
    matches!(e, VerifyError::WrongResult { .. })
}

#[test]
fn correct_twins_pass() {
    for bug in ["", "side_unsynced"] {
        let exec = Custom(
            mesh_2s,
            match bug {
                "" => |p, r| one_shot(p, r, ""),
                _ => |p, r| one_shot(p, r, "side_unsynced"),
            },
        );
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            verify(&exec, &ar(4, 7, op), &cfg()).unwrap();
        }
    }
    verify(
        &Custom(mesh, two_chunks::<false>),
        &ar(2, 8, ReduceOp::Sum),
        &cfg(),
    )
    .unwrap();
}

#[test]
fn forgotten_reduce_is_wrong() {
    let exec = Custom(mesh, |p, r| one_shot(p, r, "skip"));
    expect(&exec, &ar(4, 7, ReduceOp::Sum), &cfg(), wrong);
}

#[test]
fn double_counting_is_wrong() {
    let exec = Custom(mesh, |p, r| one_shot(p, r, "extra"));
    expect(&exec, &ar(3, 7, ReduceOp::Sum), &cfg(), |e| {
        wrong(e) && e.to_string().contains("twice")
    });
}

#[test]
fn missing_average_is_wrong() {
    let exec = Custom(mesh, |p, r| one_shot(p, r, "no_avg"));
    expect(&exec, &ar(3, 7, ReduceOp::Avg), &cfg(), wrong);
}

/// World 2, two chunks through one CCL slot; `EARLY` posts the second receive before the
/// first chunk was reduced out of the slot.
fn two_chunks<const EARLY: bool>(p: &OpParam, res: &mut AlgResourceResponse<'_>) -> Result<()> {
    let (h, peer, e) = (p.count / 2 * p.elem(), 1 - p.rank, p.elem());
    let slot = Mem::of(BufKind::CclIn);
    let t = &mut *res.tasks;
    t.rx_async(MAIN, peer, slot, h)?;
    t.tx_async(MAIN, peer, IN, h)?;
    t.rx_wait_done(MAIN, peer, h)?;
    if EARLY {
        t.rx_async(MAIN, peer, slot, h)?;
    }
    t.reduce(MAIN, p.dtype, p.op, OUT, IN, slot, h / e)?;
    if !EARLY {
        t.rx_async(MAIN, peer, slot, h)?;
    }
    t.tx_async(MAIN, peer, IN.add(h), h)?;
    t.rx_wait_done(MAIN, peer, h)?;
    t.reduce(MAIN, p.dtype, p.op, OUT.add(h), IN.add(h), slot, h / e)?;
    t.tx_wait_done(MAIN, peer)?;
    t.tx_wait_done(MAIN, peer)
}

#[test]
fn early_slot_reuse_is_a_race() {
    let exec = Custom(mesh, two_chunks::<true>);
    expect(&exec, &ar(2, 8, ReduceOp::Sum), &cfg(), |e| {
        matches!(e, VerifyError::Race { mem: "CclIn", .. })
            && e.to_string().contains("remote write")
    });
}

#[test]
fn unsynchronised_streams_race() {
    let exec = Custom(mesh_2s, |p, r| one_shot(p, r, "unsynced"));
    expect(&exec, &ar(3, 7, ReduceOp::Sum), &cfg(), |e| {
        matches!(e, VerifyError::Race { .. })
    });
}

#[test]
fn wait_without_record_deadlocks() {
    let exec = Custom(mesh_2s, |p, r| one_shot(p, r, "no_record"));
    expect(&exec, &ar(2, 7, ReduceOp::Sum), &cfg(), |e| {
        matches!(e, VerifyError::Deadlock { stuck } if stuck.len() == 2
            && stuck.iter().all(|s| s.contains("wait(notify 0")))
    });
}

#[test]
fn leftover_notify_record_is_unbalanced() {
    let exec = Custom(mesh_2s, |p, r| one_shot(p, r, "two_records"));
    expect(
        &exec,
        &ar(2, 7, ReduceOp::Sum),
        &cfg(),
        |e| matches!(e, VerifyError::Unbalanced(m) if m.contains("2 records but 1 waits")),
    );
}

#[test]
fn send_before_receive_deadlocks() {
    let exec = Custom(mesh, |p, res| {
        let (nb, peer) = (p.count * p.elem(), 1 - p.rank);
        res.send(MAIN, peer, IN, nb)?;
        res.recv(MAIN, peer, Mem::of(BufKind::CclIn), nb)?;
        res.tasks.reduce(
            MAIN,
            p.dtype,
            p.op,
            OUT,
            IN,
            Mem::of(BufKind::CclIn),
            p.count,
        )
    });
    expect(&exec, &ar(2, 7, ReduceOp::Sum), &cfg(), |e| {
        matches!(e, VerifyError::Deadlock { stuck } if stuck.len() == 2
            && stuck.iter().all(|s| s.contains("tx_async") && s.contains("has not posted")))
    });
}

#[test]
fn length_mismatch_is_caught() {
    let exec = Custom(mesh, |p, r| one_shot(p, r, "short"));
    expect(&exec, &ar(2, 7, ReduceOp::Sum), &cfg(), |e| {
        matches!(e, VerifyError::LengthMismatch(_))
    });
}

#[test]
fn missing_tx_wait_done_is_unbalanced() {
    let exec = Custom(mesh, |p, r| one_shot(p, r, "no_tx_done"));
    expect(
        &exec,
        &ar(2, 7, ReduceOp::Sum),
        &cfg(),
        |e| matches!(e, VerifyError::Unbalanced(m) if m.contains("tx_wait_done")),
    );
}

fn rejected(want: Reject) -> impl Fn(&VerifyError) -> bool {
    move |e| matches!(e, VerifyError::Rejected { kind, .. } if *kind == want)
}

fn expect_rejected(exec: &dyn Executor, p: &OpParam, c: &VerifyConfig, want: Reject) {
    match verify(exec, p, c) {
        Err(e) if rejected(want)(&e) => eprintln!("rejected as expected: {e}"),
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

#[test]
fn sink_rejections() {
    let p = ar(4, 7, ReduceOp::Sum);
    let c = cfg();
    let oob = Custom(mesh, |_, r| {
        r.tasks
            .copy(MAIN, Mem::of(BufKind::CclIn).add(r.ccl_in_size - 4), IN, 8)
    });
    expect_rejected(&oob, &p, &c, Reject::OutOfBounds);
    let out = Custom(mesh, |p, r| r.tasks.copy(MAIN, OUT.add(4), IN, p.count * 4));
    expect_rejected(&out, &p, &c, Reject::OutOfBounds);
    let misaligned = Custom(mesh, |_, r| r.tasks.copy(MAIN, OUT.add(1), IN, 4));
    expect_rejected(&misaligned, &p, &c, Reject::Misaligned);
    let read_only = Custom(mesh, |p, r| {
        r.tasks.reduce(MAIN, p.dtype, p.op, IN, IN, OUT, 1)
    });
    expect_rejected(&read_only, &p, &c, Reject::ReadOnly);
    let no_link = Custom(ring, |p, r| one_shot(p, r, ""));
    expect_rejected(&no_link, &p, &c, Reject::NoLink);
    let stream = Custom(mesh, |p, r| one_shot(p, r, "side_unsynced"));
    expect_rejected(&stream, &p, &c, Reject::UnknownNotify);
    let dtype = Custom(mesh, |_, r| {
        r.tasks
            .reduce(MAIN, DataType::F64, ReduceOp::Sum, OUT, IN, IN, 1)
    });
    expect_rejected(&dtype, &p, &c, Reject::TypeMismatch);
    let overlap = Custom(mesh, |_, r| r.tasks.copy(MAIN, OUT.add(4), OUT, 8));
    expect_rejected(&overlap, &p, &c, Reject::Overlap);
    // A tee's two destinations may not overlap at all; one of them may be the source.
    fn tee(r: &mut AlgResourceResponse<'_>, second: Mem) -> Result<()> {
        let dsts = [(OUT, CopyTo::Local), (second, CopyTo::Peer)];
        r.tasks.copy_tee(MAIN, dsts, IN, 8)
    }
    let partly = Custom(mesh, |_, r| tee(r, OUT.add(4)));
    expect_rejected(&partly, &p, &c, Reject::Overlap);
    let fully = Custom(mesh, |_, r| tee(r, OUT));
    expect_rejected(&fully, &p, &c, Reject::Overlap);
    // Accepted (only the result is wrong: this is no allreduce).
    let into_source = verify(&Custom(mesh, |_, r| tee(r, IN)), &p, &c);
    assert!(
        matches!(into_source, Err(VerifyError::WrongResult { .. })),
        "{into_source:?}"
    );
    // Receiving straight into the user output needs user-memory links.
    let direct = Custom(mesh, |p, r| {
        let (nb, peer) = (p.count * p.elem(), p.rank ^ 1);
        r.tasks.rx_async(MAIN, peer, OUT, nb)?;
        r.tasks.tx_async(MAIN, peer, IN, nb)?;
        r.tasks.rx_wait_done(MAIN, peer, nb)?;
        r.tasks.reduce(MAIN, p.dtype, p.op, OUT, OUT, IN, p.count)?;
        r.tasks.tx_wait_done(MAIN, peer)
    });
    let p2 = ar(2, 7, ReduceOp::Sum);
    expect_rejected(&direct, &p2, &c, Reject::NotPeerAccessible);
    let uml = VerifyConfig {
        user_mem_links: true,
        ..c
    };
    verify(&direct, &p2, &uml).unwrap();
    // So does offering the user input for reading; reading into it is a write.
    let offer = Custom(mesh, |p, r| r.tasks.offer_async(MAIN, p.rank ^ 1, IN, 4));
    expect_rejected(&offer, &p2, &c, Reject::NotPeerAccessible);
    let read = Custom(mesh, |p, r| {
        r.tasks.read_async(MAIN, p.rank ^ 1, IN, 4, CopyTo::Local)
    });
    expect_rejected(&read, &p2, &uml, Reject::ReadOnly);
    let bad_req = Custom(
        |p| AlgResourceRequest::with_peers(p.rank + 7, [p.rank]),
        |_, _| Ok(()),
    );
    assert!(matches!(
        verify(&bad_req, &p, &c),
        Err(VerifyError::Resource { .. })
    ));
}

/// Chunked Send/Recv through the receiver's CCL buffer; `LOSSY` drops the last copy-out.
fn send(p: &OpParam, r: &mut AlgResourceResponse<'_>) -> Result<()> {
    let nb = p.count * p.elem();
    for off in (0..nb).step_by(r.ccl_in_size) {
        r.send(MAIN, p.root, IN.add(off), r.ccl_in_size.min(nb - off))?;
    }
    Ok(())
}

fn recv<const LOSSY: bool>(p: &OpParam, r: &mut AlgResourceResponse<'_>) -> Result<()> {
    let nb = p.count * p.elem();
    for off in (0..nb).step_by(r.ccl_in_size) {
        let len = r.ccl_in_size.min(nb - off);
        r.recv(MAIN, p.root, Mem::of(BufKind::CclIn), len)?;
        if !(LOSSY && off + len == nb) {
            r.tasks
                .copy(MAIN, OUT.add(off), Mem::of(BufKind::CclIn), len)?;
        }
    }
    Ok(())
}

#[test]
fn send_recv_pairs() {
    let peer = |p: &OpParam| AlgResourceRequest::with_peers(p.rank, [p.root]);
    let (s, good, lossy) = (
        Custom(peer, send),
        Custom(peer, recv::<false>),
        Custom(peer, recv::<true>),
    );
    let p = OpParam {
        kind: OpKind::Send,
        count: 3000,
        ..ar(4, 0, ReduceOp::Sum)
    };
    let r = verify_send_recv(&s, &good, &p, 3, 1, &cfg()).unwrap();
    assert_eq!((r.transfers, r.bytes_moved), (3, 12000));
    assert_eq!(r.tasks_per_rank[0], 0);
    let e = verify_send_recv(&s, &lossy, &p, 0, 2, &cfg()).unwrap_err();
    assert!(matches!(e, VerifyError::WrongResult { rank: 2, .. }), "{e}");
}

#[test]
fn acks_and_fifo_depth() {
    let barrier = Custom(mesh, |p, r| {
        for d in 1..p.world {
            r.tasks.tx_ack(MAIN, (p.rank + d) % p.world)?;
        }
        for d in 1..p.world {
            r.tasks.rx_ack(MAIN, (p.rank + p.world - d) % p.world)?;
        }
        Ok(())
    });
    let b = OpParam {
        kind: OpKind::Barrier,
        ..ar(5, 0, ReduceOp::Sum)
    };
    verify(&barrier, &b, &cfg()).unwrap();
    let half = Custom(mesh, |p, r| r.tasks.tx_ack(MAIN, (p.rank + 1) % p.world));
    expect(&half, &b, &cfg(), |e| {
        matches!(e, VerifyError::Unbalanced(_))
    });
    // Three receives outstanding from one peer on a FIFO of two: the third cannot post.
    let deep = Custom(mesh, |p, r| {
        let peer = 1 - p.rank;
        let slot = |i: usize| Mem::of(BufKind::CclIn).add(i * 4);
        for i in 0..3 {
            r.tasks.rx_async(MAIN, peer, slot(i), 4)?;
        }
        for i in 0..3 {
            r.tasks.tx_async(MAIN, peer, IN.add(i * 4), 4)?;
        }
        for _ in 0..3 {
            r.tasks.rx_wait_done(MAIN, peer, 4)?;
            r.tasks.tx_wait_done(MAIN, peer)?;
        }
        Ok(())
    });
    let c = VerifyConfig {
        fifo_depth: 2,
        ..cfg()
    };
    expect(
        &deep,
        &ar(2, 3, ReduceOp::Sum),
        &c,
        |e| matches!(e, VerifyError::Deadlock { stuck } if stuck[0].contains("FIFO full")),
    );
}

/// World 2: each rank stages its input in `CclIn`, offers it, and reads the peer's offer
/// next to it, then reduces both in rank order. Bugs: `receive` posts a receive instead of
/// the offer, `rx_done` completes the offer as a receive, `scribble` rewrites the offered
/// slot before the peer's read is known complete.
fn pull(p: &OpParam, res: &mut AlgResourceResponse<'_>, bug: &str) -> Result<()> {
    let (nb, peer) = (p.count * p.elem(), 1 - p.rank);
    let (mine, theirs) = (slot(p, 0), slot(p, 1));
    let t = &mut *res.tasks;
    t.copy(MAIN, mine, IN, nb)?;
    if bug == "receive" {
        t.rx_async(MAIN, peer, mine, nb)?;
    } else {
        t.offer_async(MAIN, peer, mine, nb)?;
    }
    t.read_async(MAIN, peer, theirs, nb, CopyTo::Local)?;
    if bug == "scribble" {
        t.copy(MAIN, mine, OUT, nb)?;
    }
    t.tx_wait_done(MAIN, peer)?;
    if bug == "rx_done" {
        t.rx_wait_done(MAIN, peer, nb)?;
    } else {
        t.offer_wait_done(MAIN, peer, nb)?;
    }
    let (a, b) = if p.rank == 0 {
        (mine, theirs)
    } else {
        (theirs, mine)
    };
    t.reduce(MAIN, p.dtype, p.op, OUT, a, b, p.count)
}

#[test]
fn offers_and_reads() {
    verify(
        &Custom(mesh, |p, r| pull(p, r, "")),
        &ar(2, 7, ReduceOp::Sum),
        &cfg(),
    )
    .unwrap();
    let exec = Custom(mesh, |p, r| pull(p, r, "receive"));
    expect(
        &exec,
        &ar(2, 7, ReduceOp::Sum),
        &cfg(),
        |e| matches!(e, VerifyError::WayMismatch(m) if m.contains("reads") && m.contains("receive")),
    );
    let exec = Custom(mesh, |p, r| pull(p, r, "rx_done"));
    expect(
        &exec,
        &ar(2, 7, ReduceOp::Sum),
        &cfg(),
        |e| matches!(e, VerifyError::WayMismatch(m) if m.contains("rx_wait_done")),
    );
    let exec = Custom(mesh, |p, r| pull(p, r, "scribble"));
    expect(&exec, &ar(2, 7, ReduceOp::Sum), &cfg(), |e| {
        matches!(e, VerifyError::Race { mem: "CclIn", .. }) && e.to_string().contains("remote read")
    });
}
