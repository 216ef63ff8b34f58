//! The decision ring: all ranks use the same split for the domain's k-th multipath call.
//!
//! Host threads of different ranks run ahead of each other, so reading the parameter table
//! alone could give two ranks different alphas for the same call. Instead, for call `k` every
//! rank proposes a [`Decision`] and compare-and-swaps cell `k % R` from "call `k - R`" (or empty
//! in the first lap) to `(k, proposal)`; a rank whose swap fails adopts the cell's value. So
//! every rank uses the first proposer's decision.
//!
//! A cell is overwritten only after every rank has consumed the calls it holds (per-rank
//! `consumed` counters, release/acquire). A rank that finds the cell still in use spins with
//! backoff for a bounded number of rounds; then, instead of deciding alone, it increments the
//! cell's `forced` count: calls `t + R, ..., t + forced * R` (`t` the call the cell holds) are
//! fast-only for every rank, and the cell keeps call `t`'s decision readable for the laggard.
//! So this fallback is agreed through the cell too. (At [`MAX_FORCED`] laps a rank waits: a
//! split that differs between ranks would corrupt results, a wait only delays them.) A cell
//! holding a call it cannot hold, or a decision whose fingerprint (op, dtype, count) differs
//! from this rank's call, is reported as a mismatch: the caller must not split.
//!
//! Cell word: bit 0 valid, bit 1 `use_pcie`, bits 2..18 alpha (u16 units of 1/65535), bits
//! 18..36 fingerprint (18 bits), bits 36..44 `forced`, bits 44..64 call index mod 2^20. While
//! ranks share cells they are at most `(MAX_FORCED + 1) * R` calls apart, below 2^20 for
//! `R <=` [`MAX_RING_CELLS`].

use ampccl_runtime::DataType;

use super::super::key::MpOp;
use super::super::param::ParamValue;

const VALID: u64 = 1;
const USE_PCIE: u64 = 1 << 1;
const FP_BITS: u32 = 18;
const FP_MASK: u64 = (1 << FP_BITS) - 1;
const TAG_BITS: u32 = 20;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Most fast-only laps one cell can carry.
pub const MAX_FORCED: u64 = 255;
/// Largest ring (see the module docs).
pub const MAX_RING_CELLS: usize = 2048;

/// The split agreed for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Fast-path fraction in units of 1/65535 (65535: fast-only).
    pub alpha_q: u16,
    pub use_pcie: bool,
    /// Hash of the call (see [`Decision::fingerprint`]), 18 bits.
    pub fingerprint: u32,
}

impl Decision {
    /// Proposal from parameters (quantized).
    pub fn from_param(p: &ParamValue, fingerprint: u32) -> Decision {
        let a = p.effective_alpha();
        let alpha_q = (a * 65535.0).round().clamp(0.0, 65535.0) as u16;
        Decision {
            alpha_q,
            use_pcie: p.use_pcie && alpha_q < u16::MAX,
            fingerprint: (u64::from(fingerprint) & FP_MASK) as u32,
        }
    }

    /// Fast-only for the call with `fingerprint`.
    pub fn fast_only(fingerprint: u32) -> Decision {
        Decision::from_param(&ParamValue::FAST_ONLY, fingerprint)
    }

    /// Fast-path fraction (1.0 when the PCIe path is off).
    pub fn alpha(&self) -> f64 {
        if self.use_pcie {
            f64::from(self.alpha_q) / 65535.0
        } else {
            1.0
        }
    }

    /// 18-bit hash of what must agree between ranks: the op, dtype and element count.
    pub fn fingerprint(op: MpOp, dtype: DataType, count: u64) -> u32 {
        let mut z = count ^ (op as u64) << 56 ^ (dtype as u64) << 60;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z & FP_MASK) as u32
    }
}

/// A decoded cell.
#[derive(Clone, Copy, Debug)]
struct Cell {
    pub valid: bool,
    pub forced: u64,
    pub tag: u64,
    pub decision: Decision,
}

/// What a cell means for call `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// The cell holds call `k`'s decision.
    Decided(Decision),
    /// Call `k` was forced fast-only.
    Forced,
    /// The cell holds the calls before `k` in this cell: `k` is to be decided.
    Next { forced: u64 },
    /// The cell holds a call it cannot hold while this rank is at `k`.
    Foreign,
}

fn tag(call_index: u64) -> u64 {
    call_index & TAG_MASK
}

pub(super) fn encode(call_index: u64, d: &Decision, forced: u64) -> u64 {
    VALID
        | if d.use_pcie { USE_PCIE } else { 0 }
        | u64::from(d.alpha_q) << 2
        | (u64::from(d.fingerprint) & FP_MASK) << 18
        | forced.min(MAX_FORCED) << 36
        | tag(call_index) << 44
}

/// `w` with its forced count incremented.
pub(super) fn force_one_more(w: u64) -> u64 {
    w + (1 << 36)
}

fn decode(w: u64) -> Cell {
    Cell {
        valid: w & VALID != 0,
        forced: (w >> 36) & MAX_FORCED,
        tag: w >> 44,
        decision: Decision {
            alpha_q: (w >> 2) as u16,
            use_pcie: w & USE_PCIE != 0,
            fingerprint: ((w >> 18) & FP_MASK) as u32,
        },
    }
}

/// Interprets cell `w` for call `k` of a ring of `r` cells.
pub(super) fn classify(w: u64, k: u64, r: u64) -> Slot {
    let c = decode(w);
    // An empty cell stands for the virtual call `k % r - r`.
    let held = if c.valid {
        c.tag
    } else {
        tag((k % r).wrapping_sub(r))
    };
    let dist = tag(k).wrapping_sub(held) & TAG_MASK;
    if !dist.is_multiple_of(r) {
        Slot::Foreign
    } else {
        match dist / r {
            0 if c.valid => Slot::Decided(c.decision),
            m if m >= 1 && m <= c.forced => Slot::Forced,
            m if m == c.forced + 1 => Slot::Next { forced: c.forced },
            _ => Slot::Foreign,
        }
    }
}

#[cfg(all(test, not(ampccl_loom)))]
mod tests {
    use super::*;

    #[test]
    fn cells_round_trip() {
        let fp = Decision::fingerprint(MpOp::AllReduce, DataType::F32, 1 << 20);
        let d = Decision::from_param(&ParamValue::split(0.8), fp);
        let w = encode((1 << 20) + 5, &d, 0);
        let c = decode(w);
        assert!(c.valid && c.forced == 0);
        assert_eq!((c.tag, c.decision), (5, d));
        assert_eq!(decode(force_one_more(w)).forced, 1);
        let r = 4;
        assert_eq!(classify(0, 2, r), Slot::Next { forced: 0 });
        assert_eq!(classify(0, 6, r), Slot::Foreign);
        assert_eq!(classify(w, 5 + (1 << 20), r), Slot::Decided(d));
        assert_eq!(classify(w, 9, r), Slot::Next { forced: 0 });
        assert_eq!(classify(force_one_more(w), 9, r), Slot::Forced);
        assert_eq!(classify(force_one_more(w), 13, r), Slot::Next { forced: 1 });
        assert_eq!(classify(w, 6, r), Slot::Foreign);
        assert!((d.alpha() - 0.8).abs() < 1e-4);
        assert_eq!(Decision::fast_only(3).alpha(), 1.0);
        assert_ne!(
            Decision::fingerprint(MpOp::AllReduce, DataType::F32, 1000),
            Decision::fingerprint(MpOp::AllReduce, DataType::F32, 1001)
        );
    }
}
