//! The online choice between plain and streaming stores for writes into memory another core
//! reads at once: [`StoreChoice`] times both kinds per size class and serves with the cheaper,
//! [`SharedCopy`] is a copy that uses it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::param::{Param, Unit};

/// Writes from this size are timed and may use streaming stores; shorter ones use plain stores
/// (the timer would cost more than the choice gains).
pub static MIN_BYTES: Param = Param::new(
    "STORE_CHOICE_MIN",
    64 << 10,
    (1, u64::MAX),
    Unit::Bytes,
    "writes for a peer of at least this many bytes choose their store kind by measuring",
);

/// Copies into memory another core reads at once (a peer's window), with plain stores, which
/// keep the data in the cache for the reader, or streaming stores, whichever measures faster
/// ([`StoreChoice`]).
///
/// Plain stores are the right choice while the two cores hand lines to each other quickly,
/// and they usually do. But a shared virtual machine's host now and then places its vCPUs so
/// that a store to a line the other core has read costs many times more, for tens of seconds
/// at a time; then streaming stores, which go to memory without taking the line from the other
/// core, are several times cheaper.
///
/// The writer's time is not the whole price of a streamed line: the reader then takes it from
/// memory instead of from the writer's cache. So the choice counts streaming at
/// [`SharedCopy::STREAMING_WEIGHT`] times its measured cost: in a slow spell streaming is
/// still many times cheaper, outside one plain stores keep winning.
#[derive(Debug)]
pub struct SharedCopy {
    pub(super) stores: StoreChoice,
}

impl Default for SharedCopy {
    fn default() -> SharedCopy {
        SharedCopy {
            stores: StoreChoice::new(SharedCopy::STREAMING_WEIGHT),
        }
    }
}

impl SharedCopy {
    /// How many times its measured cost a streaming write into a peer's window counts.
    pub const STREAMING_WEIGHT: u64 = 2;

    /// Copies `len` bytes from `src` to `dst` (see the type's documentation).
    ///
    /// # Safety
    /// As [`super::copy`].
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        self.stores.run(len, |streaming| {
            let from = if streaming { 0 } else { usize::MAX };
            // SAFETY: forwarded.
            unsafe { super::copy_streaming_from(dst, src, len, from) }
        });
    }
}

/// Picks plain or streaming stores for writes whose cheaper kind depends on the host's state
/// at the time, by measuring both. Writes of at least [`MIN_BYTES`] are timed
/// and each kind's cost per byte is kept per size class (a power of two); the cheaper kind
/// serves, and now and then a write of the class tries the other kind. A cost takes a lower
/// sample at once and moves a quarter of the way towards a higher one (at most four times the
/// cost: a write interrupted by the scheduler is an outlier, not the store's price), so a kind
/// that turned slow loses within a few writes and one that turned fast wins at its next try.
/// Shorter writes use plain stores (the timer would cost more than the choice gains).
///
/// A try is not free: the two kinds' costs are mostly far apart, and which one is far behind
/// depends on the host's state. So the class tries the other kind every
/// [`StoreChoice::EXPLORE_PERIOD`] only while the two are close (within [`StoreChoice::LOSS`]);
/// each try the other kind loses by more doubles the wait, up to
/// [`StoreChoice::EXPLORE_PERIOD_MAX`]. The change of state that would make the other kind win
/// also shows in the serving kind's own cost, which rises many times over: when it has risen to
/// [`StoreChoice::JUMP`] times what it was at the last lost try (a few slow writes in a row; one
/// is an outlier, and the next normal write brings the cost back down), the wait is back to the
/// shortest, so the next write tries the other kind (if a period has passed since the last try).
#[derive(Debug)]
pub struct StoreChoice {
    /// Time base of the exploration clock.
    epoch: Instant,
    pub(super) classes: [SizeClass; StoreChoice::CLASSES],
}

/// What [`StoreChoice`] knows about the writes of one size class. Statistics only: relaxed
/// atomics, no ordering relied on.
#[derive(Debug)]
pub(super) struct SizeClass {
    /// Cost of each kind, picoseconds per byte, `[plain, streaming]`; 0 while not measured.
    pub(super) cost: [AtomicU64; 2],
    /// What a streaming cost is multiplied by when the kinds are compared (plain counts once).
    streaming_weight: u64,
    /// When a write of the class last tried the other kind (ns since `epoch`).
    explored: AtomicU64,
    /// How long after `explored` the next try is due (ns); 0 stands for the shortest wait,
    /// [`StoreChoice::EXPLORE_PERIOD`].
    wait: AtomicU64,
    /// The choice's cost when a try last lost by far.
    reference: AtomicU64,
}

/// The kinds of [`StoreChoice`], indices of the costs.
pub(super) const PLAIN: usize = 0;
pub(super) const STREAMING: usize = 1;

impl Default for StoreChoice {
    /// A choice by the writer's time alone.
    fn default() -> StoreChoice {
        StoreChoice::new(1)
    }
}

impl StoreChoice {
    /// The shortest wait between two tries of the kind that is not a size class's choice.
    pub const EXPLORE_PERIOD: Duration = Duration::from_millis(10);
    /// The longest wait between two tries, reached after seven tries lost by far.
    pub const EXPLORE_PERIOD_MAX: Duration = Duration::from_millis(1280);
    /// A try loses by far when it costs more than this many times the choice's cost.
    pub const LOSS: u64 = 2;
    /// The choice's cost rising to more than this many times what it was when a try last lost
    /// signals a change of state: the next try is due after the shortest wait.
    pub const JUMP: u64 = 3;
    /// Size classes: `[MIN_BYTES, 2 MIN_BYTES)`, …, the last one from 128 `MIN_BYTES` up.
    const CLASSES: usize = 8;

    /// A choice that counts streaming writes at `streaming_weight` times their measured cost
    /// (where streamed data costs someone else more than the writer sees).
    pub fn new(streaming_weight: u64) -> StoreChoice {
        StoreChoice {
            epoch: Instant::now(),
            classes: std::array::from_fn(|_| SizeClass::new(streaming_weight)),
        }
    }

    /// Runs `write` of `len` bytes, which stores with streaming stores when passed `true`,
    /// with the kind this choice picks, and learns from its time.
    pub fn run(&self, len: usize, write: impl FnOnce(bool)) {
        if len < MIN_BYTES.bytes() {
            write(false);
            return;
        }
        let class = &self.classes[Self::class_of(len)];
        let t0 = Instant::now();
        let pick = class.pick(self.nanos(t0));
        write(pick.kind == STREAMING);
        class.record(pick, len, t0.elapsed());
    }

    /// The size class of a write of `len >= MIN_BYTES` bytes.
    pub(super) fn class_of(len: usize) -> usize {
        ((len / MIN_BYTES.bytes()).ilog2() as usize).min(Self::CLASSES - 1)
    }

    /// `t` in nanoseconds since the epoch.
    fn nanos(&self, t: Instant) -> u64 {
        t.duration_since(self.epoch).as_nanos() as u64
    }
}

/// The kind one write uses, and whether it is a try of the kind that is not the choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pick {
    pub(super) kind: usize,
    pub(super) trying: bool,
}

impl SizeClass {
    /// A class that knows nothing yet, streaming counted `streaming_weight` times.
    pub(super) fn new(streaming_weight: u64) -> SizeClass {
        SizeClass {
            cost: Default::default(),
            streaming_weight,
            explored: AtomicU64::new(0),
            wait: AtomicU64::new(0),
            reference: AtomicU64::new(0),
        }
    }

    /// A cost of `kind` as the comparison counts it.
    fn weighed(&self, kind: usize, cost: u64) -> u64 {
        if kind == STREAMING {
            cost.saturating_mul(self.streaming_weight)
        } else {
            cost
        }
    }

    /// The kind a copy starting at `now` (ns since the epoch) uses: the cheaper one, except
    /// that a kind not measured yet, or not tried for the class's wait, gets this copy.
    pub(super) fn pick(&self, now: u64) -> Pick {
        let [plain, streaming] = [PLAIN, STREAMING].map(|k| self.cost[k].load(Ordering::Relaxed));
        if plain == 0 {
            return Pick {
                kind: PLAIN,
                trying: false,
            };
        }
        let best = if streaming != 0 && self.weighed(STREAMING, streaming) < plain {
            STREAMING
        } else {
            PLAIN
        };
        let last = self.explored.load(Ordering::Relaxed);
        let wait = self
            .wait
            .load(Ordering::Relaxed)
            .max(StoreChoice::EXPLORE_PERIOD.as_nanos() as u64);
        let trying = streaming == 0 || now.saturating_sub(last) >= wait;
        if trying {
            self.explored.store(now, Ordering::Relaxed);
        }
        Pick {
            kind: if trying { 1 - best } else { best },
            trying,
        }
    }

    /// Folds a copy of `len` bytes that took `took` into its kind's cost, and sets the wait
    /// before the next try.
    pub(super) fn record(&self, pick: Pick, len: usize, took: Duration) {
        let sample =
            (took.as_nanos().saturating_mul(1000) / len as u128).clamp(1, u64::MAX as u128) as u64;
        let old = self.cost[pick.kind].load(Ordering::Relaxed);
        let new = if old == 0 || sample <= old {
            sample
        } else {
            old + (sample.min(old.saturating_mul(4)) - old) / 4
        };
        self.cost[pick.kind].store(new, Ordering::Relaxed);
        if pick.trying {
            let choice = self.cost[1 - pick.kind].load(Ordering::Relaxed);
            let (tried, served) = (
                self.weighed(pick.kind, sample),
                self.weighed(1 - pick.kind, choice),
            );
            let wait = if choice != 0 && tried > served.saturating_mul(StoreChoice::LOSS) {
                self.reference.store(choice, Ordering::Relaxed);
                let longer = self.wait.load(Ordering::Relaxed).saturating_mul(2);
                longer.clamp(
                    2 * StoreChoice::EXPLORE_PERIOD.as_nanos() as u64,
                    StoreChoice::EXPLORE_PERIOD_MAX.as_nanos() as u64,
                )
            } else {
                0
            };
            self.wait.store(wait, Ordering::Relaxed);
        } else if new
            > self
                .reference
                .load(Ordering::Relaxed)
                .saturating_mul(StoreChoice::JUMP)
            && self.wait.load(Ordering::Relaxed) != 0
        {
            self.wait.store(0, Ordering::Relaxed);
        }
    }
}
