//! `OpParam`: what one collective call asks for, and its cross-rank fingerprint.

use std::hash::Hasher;

use ampccl_runtime::{DataType, Error, ReduceOp, Result};

use ampccl_transport::device::{NOT_COLLECTIVE, OpRecord};
use ampccl_transport::protocol::TAG_P2P;

use crate::fasthash::WordHasher;

/// The collective (or point-to-point) operation kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Send,
    Recv,
    Barrier,
}

impl OpKind {
    /// Every kind.
    pub const ALL: [OpKind; 9] = [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllToAll,
        OpKind::Send,
        OpKind::Recv,
        OpKind::Barrier,
    ];

    /// Name as used in algorithm names, `AMPCCL_ALGO_<OP>` (upper-cased) and messages.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "AllReduce",
            OpKind::AllGather => "AllGather",
            OpKind::ReduceScatter => "ReduceScatter",
            OpKind::Broadcast => "Broadcast",
            OpKind::Reduce => "Reduce",
            OpKind::AllToAll => "AllToAll",
            OpKind::Send => "Send",
            OpKind::Recv => "Recv",
            OpKind::Barrier => "Barrier",
        }
    }

    /// Whether the operation combines values with a [`ReduceOp`].
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce
        )
    }

    /// Whether it is a point-to-point operation (a send or a receive), which ranks issue in
    /// orders of their own, unlike collectives.
    pub const fn is_p2p(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Recv)
    }

    /// Whether `root` is meaningful (root rank, or the peer of send/recv).
    pub const fn has_root(self) -> bool {
        matches!(
            self,
            OpKind::Broadcast | OpKind::Reduce | OpKind::Send | OpKind::Recv
        )
    }

    /// Elements of the input buffer for `count` on `world` ranks (NCCL's count conventions).
    /// `None` when it overflows.
    pub const fn input_count(self, count: usize, world: usize) -> Option<usize> {
        match self {
            OpKind::ReduceScatter | OpKind::AllToAll => count.checked_mul(world),
            OpKind::Barrier | OpKind::Recv => Some(0),
            _ => Some(count),
        }
    }

    /// Elements of the output buffer; `None` when it overflows.
    pub const fn output_count(self, count: usize, world: usize) -> Option<usize> {
        match self {
            OpKind::AllGather | OpKind::AllToAll => count.checked_mul(world),
            OpKind::Barrier | OpKind::Send => Some(0),
            _ => Some(count),
        }
    }
}

/// Parameters of one operation, as the framework hands them to operators and executors.
///
/// `count` follows NCCL: AllReduce/Broadcast/Reduce/Send/Recv: elements of the buffer;
/// AllGather: elements each rank contributes; ReduceScatter: elements each rank receives;
/// AllToAll: elements sent to each peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpParam {
    pub kind: OpKind,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// Root rank (Broadcast, Reduce) or peer (Send, Recv); 0 otherwise.
    pub root: usize,
    /// This rank and the communicator size.
    pub rank: usize,
    pub world: usize,
    /// Input and output are the same memory (at NCCL's in-place offsets).
    pub in_place: bool,
    /// Sequence number of the operation on its communicator.
    pub seq: u64,
}

impl OpParam {
    /// Bytes of one element.
    pub fn elem(&self) -> usize {
        self.dtype.size()
    }

    /// Input bytes (an operation's parameters are checked against the address space when it
    /// is made, so this does not overflow; it saturates if it ever would).
    pub fn input_bytes(&self) -> usize {
        let n = self.kind.input_count(self.count, self.world);
        n.map_or(usize::MAX, |n| n.saturating_mul(self.elem()))
    }

    /// Output bytes (see [`OpParam::input_bytes`]).
    pub fn output_bytes(&self) -> usize {
        let n = self.kind.output_count(self.count, self.world);
        n.map_or(usize::MAX, |n| n.saturating_mul(self.elem()))
    }

    /// The other rank of a 2-rank algorithm `alg`; outside its domain (any other world size)
    /// an `InvalidArgument` naming it.
    pub fn pair_peer(&self, alg: &str) -> Result<usize> {
        if self.world == 2 {
            Ok(1 - self.rank)
        } else {
            Err(Error::InvalidArgument(format!(
                "{alg} needs 2 ranks (world {})",
                self.world
            )))
        }
    }

    /// 32-bit fingerprint of what every participating rank must agree on (kind, count, dtype,
    /// reduce op, root). Carried in every clear-to-send entry; a sender whose own fingerprint
    /// differs refuses the transfer, so mismatched calls fail on every rank instead of hanging
    /// or computing garbage. Send and Recv share a fingerprint (byte count only), marked with
    /// [`TAG_P2P`]; bit 31 is clear (the immediate's error flag).
    pub fn fingerprint(&self) -> u32 {
        let mut h = WordHasher::default();
        match self.kind {
            OpKind::Send | OpKind::Recv => {
                h.add(0x5032_5000);
                h.add((self.count * self.elem()) as u64);
            }
            k => {
                h.add(k as u64);
                h.add(self.count as u64);
                h.add(self.dtype as u64);
                h.add(if k.reduces() { self.op as u64 } else { 0 });
                h.add(if k.has_root() { self.root as u64 } else { 0 });
            }
        }
        let v = h.finish();
        let p2p = self.kind.is_p2p();
        let tag = ((v >> 32) as u32 ^ v as u32) & (TAG_P2P - 1);
        if p2p { tag | TAG_P2P } else { tag }
    }

    /// One-line description for logs and mismatch reports.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}(count={}, {}",
            self.kind.name(),
            self.count,
            self.dtype.name()
        );
        if self.kind.reduces() {
            s += &format!(", {}", self.op.name());
        }
        if self.kind.has_root() {
            let what = if matches!(self.kind, OpKind::Send | OpKind::Recv) {
                "peer"
            } else {
                "root"
            };
            s += &format!(", {what}={}", self.root);
        }
        s + &format!(") #{} on rank {}", self.seq, self.rank)
    }

    /// The parameters as words, for publishing to peers without formatting on the hot path, in
    /// the layout the transport reads ([`ampccl_transport::device::OpRecord`]): `tag` (the
    /// operation's [`OpParam::fingerprint`]), `collective` (its number among the
    /// communicator's collectives, `None` for a send or receive), then the parameters.
    pub fn to_record(&self, tag: u32, collective: Option<u64>) -> OpRecord {
        [
            tag as u64,
            collective.unwrap_or(NOT_COLLECTIVE),
            self.kind as u64,
            self.count as u64,
            self.dtype as u64,
            self.op as u64,
            self.root as u64,
            self.rank as u64,
            self.seq,
        ]
    }

    /// Describes a record made by [`OpParam::to_record`] (`None` if malformed).
    pub fn describe_record(r: &[u64]) -> Option<String> {
        let &[_tag, _collective, kind, count, dtype, op, root, rank, seq] = r else {
            return None;
        };
        let p = OpParam {
            kind: *OpKind::ALL.get(kind as usize)?,
            count: count as usize,
            dtype: DataType::from_raw(dtype as i32)?,
            op: ReduceOp::from_raw(op as i32)?,
            root: root as usize,
            rank: rank as usize,
            world: 0,
            in_place: false,
            seq,
        };
        Some(p.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: OpKind, count: usize) -> OpParam {
        OpParam {
            kind,
            count,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
            rank: 0,
            world: 2,
            in_place: false,
            seq: 0,
        }
    }

    #[test]
    fn fingerprints_separate_what_must_match() {
        let a = p(OpKind::AllReduce, 10);
        assert_eq!(
            a.fingerprint(),
            OpParam {
                rank: 1,
                in_place: true,
                seq: 5,
                ..a
            }
            .fingerprint()
        );
        assert_ne!(a.fingerprint(), p(OpKind::AllReduce, 11).fingerprint());
        assert_ne!(a.fingerprint(), p(OpKind::AllGather, 10).fingerprint());
        assert_ne!(
            a.fingerprint(),
            OpParam {
                op: ReduceOp::Max,
                ..a
            }
            .fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            OpParam {
                dtype: DataType::I32,
                ..a
            }
            .fingerprint()
        );
        // Send and Recv of the same byte count match each other.
        let s = OpParam {
            root: 1,
            ..p(OpKind::Send, 4)
        };
        let r = OpParam {
            root: 0,
            rank: 1,
            ..p(OpKind::Recv, 4)
        };
        assert_eq!(s.fingerprint(), r.fingerprint());
        assert!(a.fingerprint() < 1 << 31);
    }
}
