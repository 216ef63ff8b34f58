//! A fast hasher for the lookups made on every call (registry by name, resources by tag) and
//! for operation fingerprints.
//!
//! The keys are short names and integers chosen by this library, never by an adversary, so
//! `std`'s SipHash (flooding resistance) buys nothing here, and it was a tenth of a 1-rank
//! allreduce's time. This one mixes a 64-bit word per step: rotate, xor, multiply by an odd
//! constant (the multiply spreads each word into the high bits, which `HashMap` uses).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// An odd 64-bit constant with well-spread bits (2^64 divided by the golden ratio, made odd).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Word-at-a-time hasher (see the module docs).
#[derive(Default, Clone, Copy)]
pub(crate) struct WordHasher(u64);

impl WordHasher {
    /// Folds one word into the state.
    pub(crate) fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        let (words, rest) = bytes.as_chunks::<8>();
        for w in words {
            self.add(u64::from_le_bytes(*w));
        }
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            // The length keeps "ab" and "ab\0" apart.
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.add(v.into());
    }

    fn write_u32(&mut self, v: u32) {
        self.add(v.into());
    }

    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` hashed with [`WordHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash + ?Sized>(v: &T) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(v)
    }

    #[test]
    fn separates_names_tags_and_lengths() {
        let names = [
            "AllReduceRing",
            "AllReduceRinh",
            "AllReducePair",
            "ab",
            "ab\0",
            "",
            "a",
        ];
        let mut seen: Vec<u64> = names.iter().map(hash).collect();
        seen.extend((0..64u64).map(|t| hash(&("AllReduceRing", t))));
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n, "collision among the test keys");
    }

    #[test]
    fn map_finds_what_it_stored() {
        let mut m = FastMap::default();
        for t in 0..1000u64 {
            m.insert(("BroadcastChain", t), t * 3);
        }
        assert!((0..1000u64).all(|t| m[&("BroadcastChain", t)] == t * 3));
        assert_eq!(m.get(&("ReduceChain", 1)), None);
    }
}
