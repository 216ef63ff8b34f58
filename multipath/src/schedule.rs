//! The flag schedule of the PCIe pipeline (see `pcie`): which flags each stream waits for and
//! writes around pipeline chunk `g`. Kept apart from CUDA so that the loom model
//! (`tests/loom_schedule.rs`) runs exactly this schedule with threads in place of streams.
//!
//! Per chunk `g` (staging slot `g % slots`), on rank `me` of `nranks`:
//! - send stream: wait `consumed[q] ≥ g + 1 − slots` for every `q ≠ me` (the chunk that used the
//!   slot before is read by everyone), stage, write `ready[me] = g + 1`;
//! - recv stream: wait `ready[p] ≥ g + 1` for every `p` (`me` included, so an in-place output
//!   never overwrites input before it is staged), consume, write `consumed[me] = g + 1`.
//!
//! A rank never reads its own staged pieces (it has the data on its device): its send stream
//! may already stage a later chunk into a slot its receive stream is done waiting for.
//!
//! An operation may take several **rounds** per chunk (allreduce on more than two GPUs: a
//! reduce-scatter round, then an allgather round that stages what the first round reduced).
//! Each round is a step with its own number `g`; [`steps`] orders them with a one-chunk lag
//! (round `j` of chunk `c` right after round `j − 1` of chunk `c + 1`), and the send stream of a
//! later round also waits `consumed[me] ≥ after + 1`, where `after` is the step of the round
//! before: its own receive stream must have produced what it stages.
//!
//! Flag values are `g + 1` as 32-bit numbers. The GPU compares them cyclically
//! (`cuStreamWaitValue32` with `GEQ` waits until `(i32)(flag − value) ≥ 0`, [`reached`]), so
//! they may wrap: waiters are never 2³¹ steps apart. For the same reason a flag is released
//! (every wait on it satisfied, after a failure) by moving it far ahead ([`released`]), not by
//! setting it to `u32::MAX`.

/// Whether a wait for `value` is satisfied by a flag holding `flag`, as the GPU decides it
/// (`cuStreamWaitValue32`, `CU_STREAM_WAIT_VALUE_GEQ`: a cyclic comparison).
pub fn reached(flag: u32, value: u32) -> bool {
    flag.wrapping_sub(value) as i32 >= 0
}

/// The value that releases a flag holding `flag`: a quarter of the cycle ahead, so that every
/// wait for a value up to 2³⁰ steps ahead of it (far more than any pipeline has outstanding) is
/// satisfied. A stream's flag write overwrites the word, so the release must be the last write:
/// enqueued on the rank's own streams after its steps, or written by the host only when those
/// streams write no more.
pub fn released(flag: u32) -> u32 {
    flag.wrapping_add(1 << 30)
}

/// A flag of the staging area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// Rank `r` staged the chunk named by the value.
    Ready(usize),
    /// Rank `r` read every piece of the chunk named by the value.
    Consumed(usize),
}

/// Chunk `g` of a pipeline `slots` deep, seen from rank `me` of `nranks`.
#[derive(Clone, Copy, Debug)]
pub struct ChunkFlags {
    pub g: u64,
    pub me: usize,
    pub nranks: usize,
    pub slots: usize,
    /// The step whose receive produced what this step stages (a later round of a chunk).
    pub after: Option<u64>,
}

/// Round `round` of chunk `chunk` of an operation, pipeline step `g`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub chunk: usize,
    pub round: usize,
    pub g: u64,
    /// The step of the same chunk's previous round (see [`ChunkFlags::after`]).
    pub after: Option<u64>,
}

/// The steps of an operation of `chunks` chunks and `rounds` rounds each, numbered from
/// `first`, in the order both streams issue them: round `j` of chunk `c` right after round
/// `j − 1` of chunk `c + 1`, so that the send stream stages the next chunk while the receive
/// stream still works on the round a later round depends on.
pub fn steps(first: u64, chunks: usize, rounds: usize) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(chunks * rounds);
    let mut g_of = vec![0u64; chunks * rounds];
    for t in 0..(chunks + rounds).saturating_sub(1) {
        for round in 0..rounds {
            let Some(chunk) = t.checked_sub(round).filter(|&c| c < chunks) else {
                continue;
            };
            let g = first + out.len() as u64;
            g_of[chunk * rounds + round] = g;
            let after = (round > 0).then(|| g_of[chunk * rounds + round - 1]);
            out.push(Step {
                chunk,
                round,
                g,
                after,
            });
        }
    }
    out
}

impl ChunkFlags {
    /// The staging slot of the chunk.
    pub fn slot(&self) -> usize {
        (self.g % self.slots as u64) as usize
    }

    /// The value that marks the chunk done.
    pub fn value(&self) -> u32 {
        (self.g + 1) as u32
    }

    /// What the send stream waits for before staging (`flag ≥ value`).
    pub fn send_waits(&self) -> impl Iterator<Item = (Flag, u32)> + use<> {
        let reuse = (self.g >= self.slots as u64).then(|| (self.g + 1 - self.slots as u64) as u32);
        let me = self.me;
        let own = self.after.map(|a| (Flag::Consumed(me), (a + 1) as u32));
        (0..self.nranks)
            .filter(move |&q| q != me)
            .filter_map(move |q| reuse.map(|v| (Flag::Consumed(q), v)))
            .chain(own)
    }

    /// What the send stream writes once staged.
    pub fn send_signal(&self) -> (Flag, u32) {
        (Flag::Ready(self.me), self.value())
    }

    /// What the recv stream waits for before consuming (`flag ≥ value`).
    pub fn recv_waits(&self) -> impl Iterator<Item = (Flag, u32)> + use<> {
        let v = self.value();
        (0..self.nranks).map(move |p| (Flag::Ready(p), v))
    }

    /// What the recv stream writes once consumed.
    pub fn recv_signal(&self) -> (Flag, u32) {
        (Flag::Consumed(self.me), self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_round_waits_for_nothing_then_for_the_slots_last_readers() {
        let c = |g| ChunkFlags {
            g,
            me: 1,
            nranks: 3,
            slots: 2,
            after: None,
        };
        assert_eq!(c(0).send_waits().count(), 0);
        assert_eq!(c(1).send_waits().count(), 0);
        assert_eq!(c(2).slot(), 0);
        assert_eq!(
            c(2).send_waits().collect::<Vec<_>>(),
            vec![(Flag::Consumed(0), 1), (Flag::Consumed(2), 1)]
        );
        assert_eq!(c(2).send_signal(), (Flag::Ready(1), 3));
        assert_eq!(
            c(2).recv_waits().collect::<Vec<_>>(),
            vec![
                (Flag::Ready(0), 3),
                (Flag::Ready(1), 3),
                (Flag::Ready(2), 3)
            ]
        );
        assert_eq!(c(2).recv_signal(), (Flag::Consumed(1), 3));
    }

    #[test]
    fn a_later_round_waits_for_its_own_earlier_receive() {
        let c = ChunkFlags {
            g: 2,
            me: 0,
            nranks: 2,
            slots: 4,
            after: Some(0),
        };
        assert_eq!(
            c.send_waits().collect::<Vec<_>>(),
            vec![(Flag::Consumed(0), 1)]
        );
    }

    #[test]
    fn rounds_are_issued_with_a_one_chunk_lag() {
        let order: Vec<_> = steps(10, 3, 2)
            .iter()
            .map(|s| (s.chunk, s.round, s.g, s.after))
            .collect();
        assert_eq!(
            order,
            vec![
                (0, 0, 10, None),
                (1, 0, 11, None),
                (0, 1, 12, Some(10)),
                (2, 0, 13, None),
                (1, 1, 14, Some(11)),
                (2, 1, 15, Some(13)),
            ]
        );
        let single: Vec<_> = steps(0, 3, 1).iter().map(|s| (s.chunk, s.g)).collect();
        assert_eq!(single, vec![(0, 0), (1, 1), (2, 2)]);
        assert!(steps(0, 0, 2).is_empty());
    }

    #[test]
    fn release_moves_a_flag_ahead_of_every_wait_even_across_the_wrap() {
        for flag in [0u32, 7, 1 << 31, u32::MAX - 3] {
            let r = released(flag);
            for ahead in [0u32, 1, 1000, 1 << 20] {
                assert!(
                    reached(r, flag.wrapping_add(ahead)),
                    "flag {flag} + {ahead}"
                );
            }
            assert!(reached(r, flag.wrapping_sub(1000)));
        }
        // What the first release did: u32::MAX is *behind* small values for the GPU.
        assert!(!reached(u32::MAX, 5));
        assert!(reached(3, u32::MAX), "wrapped values count as ahead");
    }
}
