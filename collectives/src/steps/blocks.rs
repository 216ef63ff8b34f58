//! Splitting element ranges into near-equal blocks and CCL-buffer-sized rounds.

/// `count` elements split into `parts` blocks whose sizes differ by at most one element (the
/// first `count % parts` blocks are one larger).
#[derive(Clone, Copy, Debug)]
pub struct Blocks {
    pub count: usize,
    pub parts: usize,
}

impl Blocks {
    /// `(offset, len)` in elements of block `i`.
    pub fn block(&self, i: usize) -> (usize, usize) {
        let base = self.count / self.parts;
        let extra = self.count % self.parts;
        let off = i * base + i.min(extra);
        (off, base + usize::from(i < extra))
    }
}

/// Elements per chunk when chunks of `elem`-byte elements must fit in `bytes`.
pub fn chunk_elems(bytes: usize, elem: usize) -> usize {
    (bytes / elem).max(1)
}

/// `(start, len)` of consecutive rounds of at most `per_round` elements covering `count`.
pub fn rounds(count: usize, per_round: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..count)
        .step_by(per_round.max(1))
        .map(move |s| (s, per_round.min(count - s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_exactly_and_differ_by_at_most_one() {
        for count in [0usize, 1, 7, 1021, 1 << 20 | 3] {
            for parts in 1..=8 {
                let b = Blocks { count, parts };
                let mut next = 0;
                for i in 0..parts {
                    let (off, len) = b.block(i);
                    assert_eq!(off, next);
                    assert!(len == count / parts || len == count / parts + 1);
                    next += len;
                }
                assert_eq!(next, count);
            }
        }
        let r: Vec<_> = rounds(10, 4).collect();
        assert_eq!(r, vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(rounds(0, 4).count(), 0);
    }
}
