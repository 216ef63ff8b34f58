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
//! Flag values are `g + 1` as 32-bit numbers, compared with `≥`: they wrap after 2³² chunks.

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
        (0..self.nranks)
            .filter(move |&q| q != me)
            .filter_map(move |q| reuse.map(|v| (Flag::Consumed(q), v)))
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
}
