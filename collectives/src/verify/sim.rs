//! The simulator: runs every rank's recorded streams together, one runnable head task at a
//! time, on symbolic memory, and keeps a vector clock per stream for the race check.
//!
//! Semantics follow the runtime and the receiver-driven link protocol:
//! - a stream runs its tasks in order; `wait` on a notify needs as many records as its
//!   generation (the n-th wait needs n records);
//! - per direction `a -> b` the n-th `tx_async` of `a` matches the n-th `rx_async` of `b`;
//!   `rx_async` posts a clear-to-send (at most `fifo_depth` outstanding per direction);
//!   `tx_async` runs once its receive is posted and writes the data into the receiver at once;
//!   `rx_wait_done`/`tx_wait_done` run once the transfer happened (`rx_wait_done` checks the
//!   length); the n-th `rx_ack` needs the peer's n-th `tx_ack`;
//! - `offer_async`/`read_async`/`offer_wait_done` are numbered and matched as receives, sends
//!   and receive wait-dones, with the data copied from the offer into the reader at the read;
//!   a read must meet an offer and a send a receive.
//!
//! Happens-before edges: stream order, the records a wait is guaranteed to have seen, CTS →
//! send (→ write), send → both wait-dones, the previous use of a FIFO slot → the next CTS,
//! `tx_ack` → `rx_ack`. Asynchronous accesses (the send's read, the remote write; a read's
//! remote read and landing) carry the clock of their start and are complete only at the
//! transfer's wait-dones.

use std::rc::Rc;

use super::VerifyError;
use super::record::{Layout, Op, describe};
use super::value::Val;
use crate::resource::Mem;

/// A task by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TaskRef {
    pub rank: usize,
    pub stream: usize,
    pub index: usize,
}

/// One memory access, for the race check.
pub(crate) struct Access {
    pub rank: usize,
    pub mem: usize,
    /// Elements `start..end`.
    pub start: usize,
    pub end: usize,
    pub write: bool,
    /// The task that made it and how (`read`, `write`, `send read`, `remote write`, `remote
    /// read`, `read landing`).
    pub task: TaskRef,
    pub how: &'static str,
    /// What the accessing side knew when the access began.
    pub clock: Rc<[u32]>,
    /// `(thread, tick)` of a stream access, complete at that event.
    pub own: Option<(usize, u32)>,
    /// The transfer of an asynchronous access, complete at its wait-dones.
    pub xfer: Option<usize>,
}

/// One rank's program and memory.
pub(crate) struct RankSim {
    pub layout: Layout,
    pub streams: Vec<Vec<Op>>,
    pub notify_num: usize,
    pub mems: Vec<Vec<Val>>,
}

/// A posted receive (or offer): its memory, length, CTS clock, the task, whether an offer.
type Posted = (Mem, usize, Rc<[u32]>, TaskRef, bool);
/// A transfer that ran: length, clock of the send, transfer id.
type Xfer = (usize, Rc<[u32]>, usize);
/// Clocks of the records run, per notify, per stream.
type RecordClocks = Vec<Vec<Vec<Rc<[u32]>>>>;

/// A direction's matched operations by sequence number.
#[derive(Default)]
struct Dir {
    /// Posted receives and offers.
    posted: Vec<Option<Posted>>,
    /// Transfers: length, clock of the send, transfer id.
    xfers: Vec<Option<Xfer>>,
    rx_done: Vec<Option<Rc<[u32]>>>,
    acks: Vec<Option<Rc<[u32]>>>,
    /// Counts: tx_async, rx_async, tx_wait_done, rx_wait_done, tx_ack, rx_ack.
    n: [usize; 6],
}

fn at<T>(v: &[Option<T>], i: usize) -> Option<&T> {
    v.get(i).and_then(Option::as_ref)
}

fn put<T>(v: &mut Vec<Option<T>>, i: usize, x: T) {
    if v.len() <= i {
        v.resize_with(i + 1, || None);
    }
    v[i] = Some(x);
}

/// The whole system.
pub(crate) struct Sim {
    pub ranks: Vec<Option<RankSim>>,
    world: usize,
    fifo_depth: usize,
    pcs: Vec<Vec<usize>>,
    tbase: Vec<usize>,
    clocks: Vec<Vec<u32>>,
    dirs: Vec<Dir>,
    /// Per rank, notify: records run; per stream, clocks of the records run and the total.
    rec_done: Vec<Vec<usize>>,
    rec_clocks: Vec<RecordClocks>,
    rec_total: Vec<Vec<Vec<usize>>>,
    waits_total: Vec<Vec<usize>>,
    pub accesses: Vec<Access>,
    /// Per transfer: the `(thread, tick)` of its wait-dones.
    pub done: Vec<Vec<(usize, u32)>>,
    pub tasks_run: usize,
    pub bytes_moved: usize,
}

impl Sim {
    pub fn new(ranks: Vec<Option<RankSim>>, fifo_depth: usize) -> Sim {
        let world = ranks.len();
        let mut tbase = Vec::new();
        let mut threads = 0;
        for r in &ranks {
            tbase.push(threads);
            threads += r.as_ref().map_or(0, |r| r.streams.len());
        }
        let per_notify = |r: &RankSim, f: &dyn Fn(&Op, usize) -> usize| -> Vec<Vec<usize>> {
            (0..r.notify_num)
                .map(|n| {
                    r.streams
                        .iter()
                        .map(|s| s.iter().map(|o| f(o, n)).sum())
                        .collect()
                })
                .collect()
        };
        let rec_total: Vec<Vec<Vec<usize>>> = ranks
            .iter()
            .map(|r| {
                r.as_ref().map_or(Vec::new(), |r| {
                    per_notify(r, &|o, n| {
                        usize::from(matches!(o, Op::Record { n: m } if *m == n))
                    })
                })
            })
            .collect();
        let waits_total = ranks
            .iter()
            .map(|r| {
                r.as_ref().map_or(Vec::new(), |r| {
                    per_notify(r, &|o, n| {
                        usize::from(matches!(o, Op::Wait { n: m, .. } if *m == n))
                    })
                    .into_iter()
                    .map(|v| v.iter().sum())
                    .collect()
                })
            })
            .collect();
        Sim {
            pcs: ranks
                .iter()
                .map(|r| vec![0; r.as_ref().map_or(0, |r| r.streams.len())])
                .collect(),
            rec_done: rec_total.iter().map(|v| vec![0; v.len()]).collect(),
            rec_clocks: rec_total
                .iter()
                .map(|v| v.iter().map(|s| vec![Vec::new(); s.len()]).collect())
                .collect(),
            rec_total,
            waits_total,
            clocks: vec![vec![0; threads]; threads],
            dirs: (0..world * world).map(|_| Dir::default()).collect(),
            tbase,
            world,
            fifo_depth: fifo_depth.max(1),
            ranks,
            accesses: Vec::new(),
            done: Vec::new(),
            tasks_run: 0,
            bytes_moved: 0,
        }
    }

    fn op(&self, t: TaskRef) -> &Op {
        &self.ranks[t.rank].as_ref().expect("rank has a job").streams[t.stream][t.index]
    }

    fn desc(&self, t: TaskRef) -> String {
        describe(t.rank, t.stream, t.index, self.op(t))
    }

    /// Runs until every stream is done; a state with tasks left and none runnable is a
    /// deadlock.
    pub fn run(&mut self) -> Result<(), VerifyError> {
        loop {
            let mut progress = false;
            for r in 0..self.world {
                for s in 0..self.pcs[r].len() {
                    while self.step(r, s)? {
                        progress = true;
                    }
                }
            }
            if !progress {
                break;
            }
        }
        let mut stuck = Vec::new();
        for r in 0..self.world {
            for s in 0..self.pcs[r].len() {
                let t = TaskRef {
                    rank: r,
                    stream: s,
                    index: self.pcs[r][s],
                };
                if t.index < self.ranks[r].as_ref().map_or(0, |x| x.streams[s].len()) {
                    stuck.push(format!("{} — {}", self.desc(t), self.blocker(t)));
                }
            }
        }
        if !stuck.is_empty() {
            return Err(VerifyError::Deadlock { stuck });
        }
        self.balance()
    }

    /// Why the head task `t` cannot run.
    fn blocker(&self, t: TaskRef) -> String {
        let (w, r) = (self.world, t.rank);
        match *self.op(t) {
            Op::Wait { n, target } => format!(
                "needs record #{target} of notify {n}, {} happened",
                self.rec_done[r][n]
            ),
            Op::RxAck { peer, seq } => format!("rank {peer} never sent ack #{seq}"),
            Op::RxAsync { peer, seq, .. } => format!(
                "FIFO full: receive #{} from rank {peer} not completed",
                seq - self.fifo_depth
            ),
            Op::TxAsync { peer, seq, .. } => format!(
                "rank {peer} has not posted receive #{seq} from rank {r} ({} posted so far)",
                self.dirs[r * w + peer].n[1]
            ),
            Op::TxWaitDone { .. } => "its send has not started".into(),
            Op::RxWaitDone { peer, seq, .. } => {
                format!("rank {peer} has not sent transfer #{seq}")
            }
            _ => "blocked".into(),
        }
    }

    /// Runs the head of stream `s` of rank `r` if it can run.
    fn step(&mut self, r: usize, s: usize) -> Result<bool, VerifyError> {
        let w = self.world;
        let pc = self.pcs[r][s];
        let Some(rank) = self.ranks[r].as_ref() else {
            return Ok(false);
        };
        let Some(op) = rank.streams[s].get(pc).cloned() else {
            return Ok(false);
        };
        let me = TaskRef {
            rank: r,
            stream: s,
            index: pc,
        };
        let mut joins: Vec<Rc<[u32]>> = Vec::new();
        match op {
            Op::Wait { n, target } => {
                if self.rec_done[r][n] < target {
                    return Ok(false);
                }
                // The records this wait is guaranteed to follow, whatever the schedule: with
                // `others` records on other streams, at least `target - others` of this one.
                let total: usize = self.rec_total[r][n].iter().sum();
                for (rs, &mine) in self.rec_total[r][n].iter().enumerate() {
                    let others = total - mine;
                    if target > others {
                        joins.push(self.rec_clocks[r][n][rs][target - others - 1].clone());
                    }
                }
            }
            Op::RxAck { peer, seq } => match at(&self.dirs[peer * w + r].acks, seq) {
                Some(c) => joins.push(c.clone()),
                None => return Ok(false),
            },
            Op::RxAsync { peer, seq, .. } if seq >= self.fifo_depth => {
                match at(&self.dirs[peer * w + r].rx_done, seq - self.fifo_depth) {
                    Some(c) => joins.push(c.clone()),
                    None => return Ok(false),
                }
            }
            Op::TxAsync { peer, seq, .. } => match at(&self.dirs[r * w + peer].posted, seq) {
                Some(p) => joins.push(p.2.clone()),
                None => return Ok(false),
            },
            Op::TxWaitDone { peer, seq } => match at(&self.dirs[r * w + peer].xfers, seq) {
                Some(x) => joins.push(x.1.clone()),
                None => return Ok(false),
            },
            Op::RxWaitDone { peer, seq, .. } => match at(&self.dirs[peer * w + r].xfers, seq) {
                Some(x) => joins.push(x.1.clone()),
                None => return Ok(false),
            },
            _ => {}
        }
        // Run it: tick this stream's clock and join the edges.
        let t = self.tbase[r] + s;
        let clock = &mut self.clocks[t];
        clock[t] += 1;
        for j in &joins {
            for (c, &x) in clock.iter_mut().zip(j.iter()) {
                *c = (*c).max(x);
            }
        }
        let snap: Rc<[u32]> = clock.clone().into();
        let own = Some((t, snap[t]));
        self.pcs[r][s] += 1;
        self.tasks_run += 1;
        let acc = |mem: (usize, usize, usize), write: bool, how| Access {
            rank: r,
            mem: mem.0,
            start: mem.1,
            end: mem.2,
            write,
            task: me,
            how,
            clock: snap.clone(),
            own,
            xfer: None,
        };
        let rank = self.ranks[r].as_mut().expect("checked");
        let l = &rank.layout;
        match op {
            Op::Copy { dst, src, len } => {
                let (d, s) = (l.range(dst, len), l.range(src, len));
                let v = rank.mems[s.0][s.1..s.2].to_vec();
                rank.mems[d.0][d.1..d.2].clone_from_slice(&v);
                self.accesses.push(acc(s, false, "read"));
                self.accesses.push(acc(d, true, "write"));
            }
            Op::Reduce { dst, a, b, count } => {
                let n = count * l.elem;
                let (d, a, b) = (l.range(dst, n), l.range(a, n), l.range(b, n));
                let v: Vec<Val> = (0..count)
                    .map(|i| rank.mems[a.0][a.1 + i].combine(&rank.mems[b.0][b.1 + i]))
                    .collect();
                rank.mems[d.0][d.1..d.2].clone_from_slice(&v);
                self.accesses.push(acc(a, false, "read"));
                self.accesses.push(acc(b, false, "read"));
                self.accesses.push(acc(d, true, "write"));
            }
            Op::Avg { dst, count, n } => {
                let d = l.range(dst, count * l.elem);
                for v in &mut rank.mems[d.0][d.1..d.2] {
                    *v = v.averaged(n);
                }
                self.accesses.push(acc(d, true, "write"));
            }
            Op::Record { n } => {
                self.rec_done[r][n] += 1;
                self.rec_clocks[r][n][s].push(snap);
            }
            Op::Wait { .. } => {}
            Op::TxAck { peer, seq } => {
                let d = &mut self.dirs[r * w + peer];
                put(&mut d.acks, seq, snap);
                d.n[4] += 1;
            }
            Op::RxAck { peer, .. } => self.dirs[peer * w + r].n[5] += 1,
            Op::RxAsync {
                peer,
                mem,
                len,
                seq,
                read,
            } => {
                let d = &mut self.dirs[peer * w + r];
                put(&mut d.posted, seq, (mem, len, snap, me, read));
                d.n[1] += 1;
            }
            Op::TxAsync {
                peer,
                mem,
                len,
                seq,
                read,
            } => return self.transfer(me, peer, mem, len, seq, read, snap),
            Op::TxWaitDone { peer, seq } => {
                let d = &mut self.dirs[r * w + peer];
                let id = at(&d.xfers, seq).expect("checked").2;
                d.n[2] += 1;
                self.done[id].push((t, snap[t]));
            }
            Op::RxWaitDone {
                peer,
                len,
                seq,
                read,
            } => {
                let d = &mut self.dirs[peer * w + r];
                let (sent, _, id) = *at(&d.xfers, seq).expect("checked");
                if at(&d.posted, seq).expect("transferred").4 != read {
                    return Err(VerifyError::WayMismatch(format!(
                        "{} completes transfer #{seq} from rank {peer}, posted as the other kind",
                        self.desc(me)
                    )));
                }
                d.n[3] += 1;
                put(&mut d.rx_done, seq, snap.clone());
                self.done[id].push((t, snap[t]));
                if sent != len {
                    return Err(VerifyError::LengthMismatch(format!(
                        "{} expects {len} bytes, transfer #{seq} from rank {peer} carried {sent}",
                        self.desc(me)
                    )));
                }
            }
        }
        Ok(true)
    }

    /// A send runs: check the length against the posted receive and write the data; or a
    /// read runs: check it against the posted offer and copy the data out of it.
    #[allow(clippy::too_many_arguments)]
    fn transfer(
        &mut self,
        me: TaskRef,
        peer: usize,
        mem: Mem,
        len: usize,
        seq: usize,
        read: bool,
        snap: Rc<[u32]>,
    ) -> Result<bool, VerifyError> {
        let (r, w) = (me.rank, self.world);
        let (posted, rlen, _, rx_task, offer) = at(&self.dirs[r * w + peer].posted, seq)
            .expect("checked")
            .clone();
        if offer != read {
            let (ours, theirs) = if read {
                ("reads", "a receive")
            } else {
                ("sends", "an offer")
            };
            return Err(VerifyError::WayMismatch(format!(
                "{} {ours} transfer #{seq}, which {} posted as {theirs}",
                self.desc(me),
                self.desc(rx_task)
            )));
        }
        if rlen != len {
            let (verb, posted) = if read {
                ("reads", "offered")
            } else {
                ("sends", "posted for")
            };
            return Err(VerifyError::LengthMismatch(format!(
                "{} {verb} {len} bytes of {}, {posted} {rlen}",
                self.desc(me),
                self.desc(rx_task)
            )));
        }
        let id = self.done.len();
        self.done.push(Vec::new());
        let d = &mut self.dirs[r * w + peer];
        put(&mut d.xfers, seq, (len, snap.clone(), id));
        d.n[0] += 1;
        self.bytes_moved += len;
        // The data flows from `(from, src)` to `(to, dst)`.
        let ((from, src), (to, dst)) = if read {
            ((peer, posted), (r, mem))
        } else {
            ((r, mem), (peer, posted))
        };
        let fr = self.ranks[from].as_ref().expect("both sides have a job");
        let s = fr.layout.range(src, len);
        let v = fr.mems[s.0][s.1..s.2].to_vec();
        let tr = self.ranks[to].as_mut().expect("both sides have a job");
        let dd = tr.layout.range(dst, len);
        tr.mems[dd.0][dd.1..dd.2].clone_from_slice(&v);
        let (how_src, how_dst) = if read {
            ("remote read", "read landing")
        } else {
            ("send read", "remote write")
        };
        for (rank, m, write, how) in [(from, s, false, how_src), (to, dd, true, how_dst)] {
            self.accesses.push(Access {
                rank,
                mem: m.0,
                start: m.1,
                end: m.2,
                write,
                task: me,
                how,
                clock: snap.clone(),
                own: None,
                xfer: Some(id),
            });
        }
        Ok(true)
    }

    /// After a complete run: every started operation was completed and matched, and the
    /// notifies are back in step (leftovers would satisfy the next operation's waits early).
    fn balance(&self) -> Result<(), VerifyError> {
        let w = self.world;
        let mut bad = Vec::new();
        for a in 0..w {
            for b in 0..w {
                let n = self.dirs[a * w + b].n;
                let pairs = [
                    (0, 1, "tx_async", "rx_async"),
                    (0, 2, "tx_async", "tx_wait_done"),
                    (1, 3, "rx_async", "rx_wait_done"),
                    (4, 5, "tx_ack", "rx_ack"),
                ];
                for (i, j, x, y) in pairs {
                    if n[i] != n[j] {
                        bad.push(format!("link {a} -> {b}: {} {x} but {} {y}", n[i], n[j]));
                    }
                }
            }
        }
        for (r, notifies) in self.rec_total.iter().enumerate() {
            for (n, per_stream) in notifies.iter().enumerate() {
                let (rec, wait) = (per_stream.iter().sum::<usize>(), self.waits_total[r][n]);
                if rec != wait {
                    bad.push(format!(
                        "rank {r} notify {n}: {rec} records but {wait} waits"
                    ));
                }
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(VerifyError::Unbalanced(bad.join("; ")))
        }
    }

    /// `(thread, tick)` pairs after which access `a` is complete.
    fn completions<'s>(&'s self, a: &'s Access) -> impl Iterator<Item = (usize, u32)> + 's {
        a.own.into_iter().chain(
            a.xfer
                .into_iter()
                .flat_map(|x| self.done[x].iter().copied()),
        )
    }

    /// Whether access `a` is known complete when `b` begins.
    pub fn happens_before(&self, a: &Access, b: &Access) -> bool {
        self.completions(a).any(|(t, k)| b.clock[t] >= k)
    }

    /// Description of the task behind an access.
    pub fn access_desc(&self, a: &Access) -> String {
        format!("{} of {}", a.how, self.desc(a.task))
    }
}
