//! [`ShmParamStore`]: the per-domain parameter store in shared memory, and [`Aggregator`],
//! rank 0's loop that turns the ranks' stats into the table.
//!
//! The store lives in a caller-provided [`Region`] of 64-bit atomic words (a POSIX shm segment,
//! a heap buffer in tests, loom atomics under `--cfg ampccl_loom`). Layout, in words:
//!
//! ```text
//! header   magic, version, nranks, table_entries, ring_cells, total_words, table_version, -
//! table    table_entries × [key (claimed by CAS, 0 = empty), seq, alpha|calls|use_pcie, bws]
//! ranks    nranks × ([consumed, stat_gen, pad ×6] + table_entries × [seq, call, 5 stat words, pad])
//! ring     ring_cells × cell (see ring)
//! ```
//! Every rank writes only its own stat slots (one per key: its latest [`ExecStat`] and the call
//! it belongs to) and its `consumed` counter; rank 0 alone writes the table. Slots and table
//! entries are single-writer seqlocks (`store/seqlock.rs`); keys are claimed lock-free; nothing a
//! crashed process could leave held blocks the others (an interrupted seqlock write only makes
//! that entry unreadable until its writer writes again; readers give up after bounded retries).

mod ring;
mod seqlock;

use std::collections::HashMap;

use ampccl_runtime::doorbell::Keepalive;
use ampccl_runtime::sync::{AtomicU64, Ordering, spin_hint};

pub use ring::Decision;

use super::controller::{Controller, ExecStat};
use super::key::OpKey;
use super::param::{ParamCache, ParamValue};

const MAGIC: u64 = u64::from_le_bytes(*b"AMPCPRM1");
/// Layout version; a segment of another version is refused.
pub const VERSION: u64 = 1;
const HEADER: usize = 8;
const ENTRY: usize = 4;
const RANK_HEAD: usize = 8;
const STAT: usize = 8;
/// Decision-ring cells of [`Layout::new`].
pub const DEFAULT_RING_CELLS: usize = 1024;
/// Seqlock read attempts before an entry counts as unreadable.
#[cfg(not(ampccl_loom))]
const READ_TRIES: u32 = 1000;
#[cfg(ampccl_loom)]
const READ_TRIES: u32 = 3;
/// Backoff rounds a rank waits for a ring cell before forcing fast-only.
const DEFAULT_WAIT_ROUNDS: u32 = 20_000;
const MAX_RANKS: usize = 1 << 16;

/// Errors of the store (converted into [`ampccl_runtime::Error`] at the crate boundary).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("parameter store: region of {have} bytes, {need} needed")]
    TooSmall { have: usize, need: usize },
    #[error("parameter store: not initialised yet")]
    NotReady,
    #[error("parameter store: bad header ({0})")]
    BadHeader(&'static str),
    #[error("parameter store: invalid layout ({0})")]
    BadLayout(&'static str),
    #[error("parameter store: table full")]
    TableFull,
    #[error("parameter store: only rank 0 writes the table")]
    NotLeader,
    #[error("parameter store: entry being written (writer died?)")]
    Busy,
    #[error("parameter store: call {got} decided out of order (expected {expected})")]
    OutOfOrder { expected: u64, got: u64 },
    #[error("multipath call {call}: ranks disagree on the call (different op, dtype or count)")]
    Mismatch { call: u64 },
}

impl From<StoreError> for ampccl_runtime::Error {
    fn from(e: StoreError) -> Self {
        use ampccl_runtime::Error as E;
        match e {
            StoreError::Mismatch { .. } | StoreError::OutOfOrder { .. } => {
                E::InvalidUsage(e.to_string())
            }
            StoreError::Busy => E::Timeout(e.to_string()),
            _ => E::System(e.to_string()),
        }
    }
}

/// Sizes of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub nranks: usize,
    pub table_entries: usize,
    pub ring_cells: usize,
}

impl Layout {
    /// `nranks` ranks, `table_entries` keys, [`DEFAULT_RING_CELLS`] ring cells.
    pub fn new(nranks: usize, table_entries: usize) -> Layout {
        Layout {
            nranks,
            table_entries,
            ring_cells: DEFAULT_RING_CELLS,
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.nranks == 0 || self.nranks > MAX_RANKS {
            return Err(StoreError::BadLayout("nranks"));
        }
        if self.table_entries == 0 || self.table_entries > 1 << 20 {
            return Err(StoreError::BadLayout("table_entries"));
        }
        if self.ring_cells == 0 || self.ring_cells > ring::MAX_RING_CELLS {
            return Err(StoreError::BadLayout("ring_cells"));
        }
        Ok(())
    }

    fn table(&self) -> usize {
        HEADER
    }
    fn rank_area(&self, r: usize) -> usize {
        HEADER + self.table_entries * ENTRY + r * (RANK_HEAD + self.table_entries * STAT)
    }
    fn ring(&self) -> usize {
        self.rank_area(self.nranks)
    }
    fn words(&self) -> usize {
        self.ring() + self.ring_cells
    }

    /// Bytes of a region holding this layout.
    pub fn bytes(&self) -> usize {
        self.words() * 8
    }
}

/// Memory a store lives in: 8-byte aligned atomic words, kept alive by a handle.
#[derive(Clone)]
pub struct Region {
    words: *const AtomicU64,
    len: usize,
    _keep: Keepalive,
}

// SAFETY: the words are only accessed through atomics and `_keep` keeps them alive.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// A zeroed region of at least `bytes` bytes in process memory.
    pub fn owned(bytes: usize) -> Region {
        let v: std::sync::Arc<[AtomicU64]> =
            (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        Region {
            words: v.as_ptr(),
            len: v.len(),
            _keep: std::sync::Arc::new(v),
        }
    }

    /// A region over `len` bytes at `ptr` (e.g. a mapped POSIX shm segment).
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for reads and writes of `len` bytes for as long
    /// as `keep` lives; the bytes must be zero (a new segment) or hold a store, and every
    /// process must access them only through a store (atomically).
    #[cfg(not(ampccl_loom))]
    pub unsafe fn from_raw(
        ptr: *mut u8,
        len: usize,
        keep: Keepalive,
    ) -> Result<Region, StoreError> {
        if ptr.is_null() || ptr.align_offset(8) != 0 {
            return Err(StoreError::BadLayout("region pointer not 8-byte aligned"));
        }
        Ok(Region {
            words: ptr.cast::<AtomicU64>().cast_const(),
            len: len / 8,
            _keep: keep,
        })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `words` points to `len` initialised atomic words (owned: a live Arc slice;
        // raw: the caller's guarantee), valid while `_keep` lives, which `self` holds.
        unsafe { std::slice::from_raw_parts(self.words, self.len) }
    }
}

/// One rank's handle on a domain's parameter store. Cheap to clone.
#[derive(Clone)]
pub struct ShmParamStore {
    region: Region,
    layout: Layout,
    rank: usize,
    wait_rounds: u32,
}

impl ShmParamStore {
    /// Bytes a store of `nranks` ranks and `table_entries` keys needs (default ring).
    pub fn bytes_needed(nranks: usize, table_entries: usize) -> usize {
        Layout::new(nranks, table_entries).bytes()
    }

    /// Initialises a store in a zeroed `region` (done by one process, before others attach).
    pub fn create(region: Region, layout: Layout, rank: usize) -> Result<Self, StoreError> {
        layout.check()?;
        if region.len < layout.words() {
            return Err(StoreError::TooSmall {
                have: region.len * 8,
                need: layout.bytes(),
            });
        }
        let w = region.words();
        w[1].store(VERSION, Ordering::Relaxed);
        w[2].store(layout.nranks as u64, Ordering::Relaxed);
        w[3].store(layout.table_entries as u64, Ordering::Relaxed);
        w[4].store(layout.ring_cells as u64, Ordering::Relaxed);
        w[5].store(layout.words() as u64, Ordering::Relaxed);
        w[0].store(MAGIC, Ordering::Release);
        Self::attach(region, rank)
    }

    /// Attaches to a store another process created; validates the header.
    pub fn attach(region: Region, rank: usize) -> Result<Self, StoreError> {
        let w = region.words();
        if w.len() < HEADER {
            return Err(StoreError::TooSmall {
                have: region.len * 8,
                need: HEADER * 8,
            });
        }
        match w[0].load(Ordering::Acquire) {
            0 => return Err(StoreError::NotReady),
            MAGIC => {}
            _ => return Err(StoreError::BadHeader("magic")),
        }
        if w[1].load(Ordering::Relaxed) != VERSION {
            return Err(StoreError::BadHeader("version"));
        }
        let field = |i: usize| usize::try_from(w[i].load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let layout = Layout {
            nranks: field(2),
            table_entries: field(3),
            ring_cells: field(4),
        };
        layout.check()?;
        if field(5) != layout.words() || layout.words() > region.len {
            return Err(StoreError::BadHeader("layout size"));
        }
        if rank >= layout.nranks {
            return Err(StoreError::BadLayout("rank"));
        }
        Ok(ShmParamStore {
            region,
            layout,
            rank,
            wait_rounds: DEFAULT_WAIT_ROUNDS,
        })
    }

    /// A store in process memory, one handle per rank (tests, thread-mode domains).
    pub fn in_memory(layout: Layout) -> Result<Vec<Self>, StoreError> {
        let first = Self::create(Region::owned(layout.bytes()), layout, 0)?;
        (0..layout.nranks)
            .map(|r| Self::attach(first.region.clone(), r))
            .collect()
    }

    /// This handle with another bound on the ring wait (backoff rounds before fast-only).
    pub fn with_wait_rounds(mut self, rounds: u32) -> Self {
        self.wait_rounds = rounds;
        self
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn w(&self) -> &[AtomicU64] {
        self.region.words()
    }

    /// Table index of `key`, claiming a free entry when `claim`.
    fn index_of(&self, key: &OpKey, claim: bool) -> Result<Option<usize>, StoreError> {
        let packed = u64::from(key.pack());
        let n = self.layout.table_entries;
        let start = (packed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % n;
        for i in (0..n).map(|j| (start + j) % n) {
            let slot = &self.w()[self.layout.table() + i * ENTRY];
            match slot.load(Ordering::Acquire) {
                k if k == packed => return Ok(Some(i)),
                0 if !claim => return Ok(None),
                0 => match slot.compare_exchange(0, packed, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Ok(Some(i)),
                    Err(k) if k == packed => return Ok(Some(i)),
                    Err(_) => {}
                },
                _ => {}
            }
        }
        if claim {
            Err(StoreError::TableFull)
        } else {
            Ok(None)
        }
    }

    /// Publishes this rank's stat of call `call_index` of `key`.
    pub fn publish_stat(
        &self,
        key: &OpKey,
        call_index: u64,
        s: &ExecStat,
    ) -> Result<(), StoreError> {
        let i = self.index_of(key, true)?.ok_or(StoreError::TableFull)?;
        let base = self.layout.rank_area(self.rank);
        let at = base + RANK_HEAD + i * STAT;
        let vals = [
            call_index,
            s.fast_time_us.to_bits(),
            s.pcie_time_us.to_bits(),
            s.fast_bytes,
            s.pcie_bytes,
            u64::from(s.success),
        ];
        seqlock::write(&self.w()[at], &self.w()[at + 1..at + 7], &vals);
        self.w()[base + 1].fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Rank `rank`'s latest stat of `key` and the call it belongs to.
    pub fn read_stat(
        &self,
        rank: usize,
        key: &OpKey,
    ) -> Result<Option<(u64, ExecStat)>, StoreError> {
        let Some(i) = self.index_of(key, false)? else {
            return Ok(None);
        };
        if rank >= self.layout.nranks {
            return Err(StoreError::BadLayout("rank"));
        }
        let at = self.layout.rank_area(rank) + RANK_HEAD + i * STAT;
        let mut v = [0u64; 6];
        let seq = seqlock::read(&self.w()[at], &self.w()[at + 1..at + 7], &mut v, READ_TRIES)
            .ok_or(StoreError::Busy)?;
        Ok((seq != 0).then(|| {
            let stat = ExecStat {
                fast_time_us: f64::from_bits(v[1]),
                pcie_time_us: f64::from_bits(v[2]),
                fast_bytes: v[3],
                pcie_bytes: v[4],
                success: v[5] != 0,
            };
            (v[0], stat)
        }))
    }

    /// Writes `key`'s parameters (rank 0 only).
    pub fn write_param(&self, key: &OpKey, p: &ParamValue) -> Result<(), StoreError> {
        if self.rank != 0 {
            return Err(StoreError::NotLeader);
        }
        let i = self.index_of(key, true)?.ok_or(StoreError::TableFull)?;
        let at = self.layout.table() + i * ENTRY;
        let a = u64::from(p.alpha.to_bits())
            | u64::from(p.calls & 0x7fff_ffff) << 32
            | u64::from(p.use_pcie) << 63;
        let b = u64::from(p.fast_bw.to_bits()) | u64::from(p.pcie_bw.to_bits()) << 32;
        seqlock::write(&self.w()[at + 1], &self.w()[at + 2..at + 4], &[a, b]);
        self.w()[6].fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// `key`'s parameters as rank 0 last wrote them (`None`: not learned yet).
    pub fn read_param(&self, key: &OpKey) -> Result<Option<ParamValue>, StoreError> {
        let Some(i) = self.index_of(key, false)? else {
            return Ok(None);
        };
        self.read_entry(i).map(|e| e.map(|(_, p)| p))
    }

    fn read_entry(&self, i: usize) -> Result<Option<(OpKey, ParamValue)>, StoreError> {
        let at = self.layout.table() + i * ENTRY;
        let Some(key) = u32::try_from(self.w()[at].load(Ordering::Acquire))
            .ok()
            .and_then(OpKey::unpack)
        else {
            return Ok(None);
        };
        let mut v = [0u64; 2];
        let seq = seqlock::read(
            &self.w()[at + 1],
            &self.w()[at + 2..at + 4],
            &mut v,
            READ_TRIES,
        )
        .ok_or(StoreError::Busy)?;
        let p = ParamValue {
            alpha: f32::from_bits(v[0] as u32),
            calls: (v[0] >> 32) as u32 & 0x7fff_ffff,
            use_pcie: v[0] >> 63 != 0,
            fast_bw: f32::from_bits(v[1] as u32),
            pcie_bw: f32::from_bits((v[1] >> 32) as u32),
        };
        Ok((seq != 0 && p.is_valid()).then_some((key, p)))
    }

    /// Bumped by every table write: re-read the table only when it changed.
    pub fn table_version(&self) -> u64 {
        self.w()[6].load(Ordering::Acquire)
    }

    /// A snapshot of the whole table (entries being written are skipped).
    pub fn snapshot(&self) -> ParamCache {
        let mut c = ParamCache::new();
        for i in 0..self.layout.table_entries {
            if let Ok(Some((k, p))) = self.read_entry(i) {
                c.insert(k, p);
            }
        }
        c
    }

    /// The split for this rank's call `call_index` (0, 1, 2, ... — every rank counts its
    /// multipath calls identically): `proposal` if this rank proposes first, else the first
    /// proposer's. See `store/ring.rs` for the protocol. Errors: [`StoreError::Mismatch`] (the ranks'
    /// calls differ: do not split) and [`StoreError::OutOfOrder`].
    pub fn decide(&self, call_index: u64, proposal: Decision) -> Result<Decision, StoreError> {
        let l = self.layout;
        let consumed = &self.w()[l.rank_area(self.rank)];
        let expected = consumed.load(Ordering::Relaxed);
        if call_index != expected {
            return Err(StoreError::OutOfOrder {
                expected,
                got: call_index,
            });
        }
        let r = l.ring_cells as u64;
        let cell = &self.w()[l.ring() + (call_index % r) as usize];
        let fast_only = Decision::fast_only(proposal.fingerprint);
        let mut rounds = 0u32;
        let outcome = loop {
            let cur = cell.load(Ordering::Acquire);
            match ring::classify(cur, call_index, r) {
                ring::Slot::Decided(d) => break Ok(d),
                ring::Slot::Forced => break Ok(fast_only),
                ring::Slot::Foreign => break Err(StoreError::Mismatch { call: call_index }),
                ring::Slot::Next { forced } => {
                    let free = call_index < r
                        || (0..l.nranks).all(|j| {
                            self.w()[l.rank_area(j)].load(Ordering::Acquire) > call_index - r
                        });
                    let (new, d) = if free {
                        (ring::encode(call_index, &proposal, 0), proposal)
                    } else if rounds >= self.wait_rounds && forced < ring::MAX_FORCED {
                        // A rank still needs this cell: agree on fast-only through it.
                        (ring::force_one_more(cur), fast_only)
                    } else {
                        rounds = rounds.saturating_add(1);
                        backoff(rounds);
                        continue;
                    };
                    if cell
                        .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        if !free {
                            tracing::debug!(call_index, "multipath decision ring full: fast-only");
                        }
                        break Ok(d);
                    }
                }
            }
        };
        consumed.store(call_index + 1, Ordering::Release);
        match outcome {
            Ok(d) if d.fingerprint != proposal.fingerprint => {
                Err(StoreError::Mismatch { call: call_index })
            }
            o => o,
        }
    }

    /// Sum over ranks of their stat-publication counters (changes when any rank published).
    fn stat_generation(&self) -> u64 {
        (0..self.layout.nranks)
            .map(|r| self.w()[self.layout.rank_area(r) + 1].load(Ordering::Acquire))
            .fold(0u64, u64::wrapping_add)
    }
}

fn backoff(round: u32) {
    if round < 64 {
        spin_hint();
    } else {
        #[cfg(not(ampccl_loom))]
        std::thread::yield_now();
        #[cfg(ampccl_loom)]
        spin_hint();
    }
}

/// Rank 0's side: folds the ranks' stats (max over ranks) into the controller and the table.
pub struct Aggregator {
    ctrl: Box<dyn Controller>,
    /// Per key, the newest call folded in.
    seen: HashMap<OpKey, u64>,
    generation: u64,
}

impl Aggregator {
    pub fn new(ctrl: Box<dyn Controller>) -> Aggregator {
        Aggregator {
            ctrl,
            seen: HashMap::new(),
            generation: u64::MAX,
        }
    }

    pub fn controller(&self) -> &dyn Controller {
        &*self.ctrl
    }

    /// Seeds the table (e.g. from a parameter file); rank 0 only.
    pub fn seed(&mut self, store: &ShmParamStore, params: &ParamCache) -> Result<(), StoreError> {
        for (k, p) in params.sorted() {
            store.write_param(&k, &p)?;
        }
        Ok(())
    }

    /// Folds in every key whose stats all ranks have published since the last fold (each
    /// rank's newest call newer than any folded before) and writes the new parameters.
    /// Returns the keys updated. Cheap when no rank published anything.
    pub fn poll(&mut self, store: &ShmParamStore) -> Result<usize, StoreError> {
        let generation = store.stat_generation();
        if generation == self.generation {
            return Ok(0);
        }
        self.generation = generation;
        let mut updated = 0;
        for i in 0..store.layout.table_entries {
            let at = store.layout.table() + i * ENTRY;
            let Some(key) = u32::try_from(store.w()[at].load(Ordering::Acquire))
                .ok()
                .and_then(OpKey::unpack)
            else {
                continue;
            };
            let seen = self.seen.get(&key).copied();
            let mut agg: Option<(u64, ExecStat)> = None;
            let mut complete = true;
            for r in 0..store.layout.nranks {
                match store.read_stat(r, &key) {
                    Ok(Some((call, s))) if seen.is_none_or(|c| call > c) && s.is_sane() => {
                        agg = Some(match agg {
                            None => (call, s),
                            Some((c, a)) => (c.max(call), a.max_with(&s)),
                        });
                    }
                    _ => complete = false,
                }
            }
            let (Some((call, stat)), true) = (agg, complete) else {
                continue;
            };
            self.seen.insert(key, call);
            let current = store
                .read_param(&key)?
                .unwrap_or_else(|| self.ctrl.initial(&key));
            let next = self.ctrl.update(&key, &current, &stat);
            store.write_param(&key, &next)?;
            updated += 1;
        }
        Ok(updated)
    }
}

#[cfg(all(test, not(ampccl_loom)))]
mod tests;
