//! Bulk copies of stream tasks: on x86-64 with AVX2 a vector loop from [`VECTOR_MIN`] bytes
//! (`memcpy` below it, and without AVX2), with non-temporal (streaming) stores from
//! [`STREAM_MIN`].
//!
//! A plain store to a line that is not cached first reads the line from memory (read for
//! ownership), so a large `memcpy` moves three bytes through the memory bus per byte copied.
//! Streaming stores write whole lines without reading them: two bytes per byte. They also
//! leave the cache alone, which is right for large copies into a final destination (the
//! destination of a multi-megabyte copy does not fit in the cache anyway) and wrong for data
//! another core reads at once, so only stream tasks' copies and reads out of a peer's window
//! (which land in their final place) use them; the transports' writes into a peer's window
//! ([`SharedCopy`]) use them only while they measure well ahead there. [`copy_out`] streams from
//! a smaller size, for callers that know the destination is an operation's output that
//! nothing reads again soon.
//!
//! Where one source goes to two places (an operation's own output and memory a peer reads),
//! [`tee`] copies it in one pass, block by block, each destination stored for its reader.
//!
//! Streaming stores are weakly ordered: [`copy`] ends with `sfence`, so a release store after
//! it (a completion flag another process polls) is ordered after the copied data, as it is after
//! a plain `memcpy`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::task::CopyTo;

/// Copies at least this long use streaming stores (where the CPU has AVX2). Measured on the
/// dev machine (`cargo bench -p ampccl-runtime --bench copy`): at 1 MiB (cache-resident) the
/// streaming copy is slower than `memcpy`, from 4 MiB up it is faster (docs/PERFORMANCE.md).
pub const STREAM_MIN: usize = 4 << 20;
/// The same for [`copy_out`]: pieces of a large operation's output, which nothing reads again
/// soon, stream from this size (the 2 MiB pieces of `AllReducePair`, docs/PERFORMANCE.md).
pub const STREAM_OUT_MIN: usize = 1 << 20;

/// Copies of at least this many bytes run the library's own vector loop (where the CPU has
/// AVX2) instead of `memcpy`. Above glibc's threshold (8 KiB on AVX-512 machines) its `memcpy`
/// is `rep movsb`, which on AMD Zen 4 moves lines another core has just written at half the
/// rate of a vector loop or less: a 2-thread producer/consumer test through a 1 MiB window
/// copied 12 GB/s with `memcpy` against 30–37 GB/s with AVX2 loads and stores (session 10,
/// docs/PERFORMANCE.md). Below it `memcpy` is a vector loop already.
pub const VECTOR_MIN: usize = 8 << 10;

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for `len` reads, `dst` for `len` writes,
/// the two ranges disjoint.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, STREAM_MIN) }
}

/// Copies `len` bytes into an operation's output that is not read again soon: streaming
/// stores from [`STREAM_OUT_MIN`] bytes.
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_out(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { copy_streaming_from(dst, src, len, STREAM_OUT_MIN) }
}

/// Copies `len` bytes stored for who reads them next: [`copy`], [`copy_out`] or
/// [`copy_to_peer`].
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_to(to: CopyTo, dst: *mut u8, src: *const u8, len: usize) {
    let f = match to {
        CopyTo::Local => copy,
        CopyTo::Output => copy_out,
        CopyTo::Peer => copy_to_peer,
    };
    // SAFETY: forwarded.
    unsafe { f(dst, src, len) }
}

/// The store choice of [`copy_to_peer`].
static TO_PEER: std::sync::LazyLock<SharedCopy> = std::sync::LazyLock::new(SharedCopy::default);

/// Copies into memory this rank offers a peer, which the peer reads at once (a piece staged
/// in the window), as [`SharedCopy`] writes into a peer's window.
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_to_peer(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded.
    unsafe { TO_PEER.copy(dst, src, len) }
}

/// Copies into memory another core reads at once (a peer's window), with plain stores, which
/// keep the data in the cache for the reader, or streaming stores, whichever measures faster
/// ([`StoreChoice`]).
///
/// Plain stores are the right choice while the two cores hand lines to each other quickly,
/// and they usually do: a 2-process producer/consumer test (a 512 KiB copy into slots
/// rotating over 4 MiB, the consumer copying out) takes 13 µs per copy with plain stores
/// and 34 µs with streaming ones. But this shared host now and then places the VM's two
/// vCPUs so that a store to a line the other core has read costs many times more, for tens
/// of seconds at a time; then the same test takes 155–223 µs with plain stores and 24–30 µs
/// with streaming ones, which go to memory without taking the line from the other core
/// (session 10, docs/PERFORMANCE.md).
///
/// The writer's time is not the whole price of a streamed line: the reader then takes it from
/// memory instead of from the writer's cache. Timed at the writer alone, streaming stores cost
/// 57 ps/B against plain ones' 36 on a 1 MiB broadcast's 128 KiB pieces, but served a fifth of
/// the writes whenever the plain cost rose for a while, and the broadcast took 37–43 µs instead
/// of 34–35 with plain stores only (session 13, docs/PERFORMANCE.md). So the choice counts
/// streaming at [`SharedCopy::STREAMING_WEIGHT`] times its measured cost: in a slow spell
/// streaming is still many times cheaper.
#[derive(Debug)]
pub struct SharedCopy {
    stores: StoreChoice,
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
    /// As [`copy`].
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        self.stores.run(len, |streaming| {
            let from = if streaming { 0 } else { usize::MAX };
            // SAFETY: forwarded.
            unsafe { copy_streaming_from(dst, src, len, from) }
        });
    }
}

/// Picks plain or streaming stores for writes whose cheaper kind depends on the host's state
/// at the time, by measuring both. Writes of at least [`StoreChoice::MIN_BYTES`] are timed
/// and each kind's cost per byte is kept per size class (a power of two); the cheaper kind
/// serves, and now and then a write of the class tries the other kind. A cost takes a lower
/// sample at once and moves a quarter of the way towards a higher one (at most four times the
/// cost: a write interrupted by the scheduler is an outlier, not the store's price), so a kind
/// that turned slow loses within a few writes and one that turned fast wins at its next try.
/// Shorter writes use plain stores (the timer would cost more than the choice gains).
///
/// A try is not free: the two kinds' costs are mostly far apart, and which one is far behind
/// depends on the host's state. Writes into a peer's window (the 128 KiB pieces of a 1 MiB
/// broadcast) cost 21–25 ps/B plain and 40–960 ps/B streaming while the cores hand lines over
/// quickly, 300–820 ps/B plain and 32–57 ps/B streaming during a slow spell (session 13). A try
/// every 10 ms made a 2 MiB broadcast take 84 µs instead of 68 (docs/PERFORMANCE.md). So the
/// class tries the other kind every [`StoreChoice::EXPLORE_PERIOD`] only while the two are
/// close (within [`StoreChoice::LOSS`]); each try the other kind loses by more doubles the
/// wait, up to [`StoreChoice::EXPLORE_PERIOD_MAX`]. The change of state that would make the
/// other kind win also shows in the serving kind's own cost, which rises many times over:
/// when it has risen to [`StoreChoice::JUMP`] times what it was at the last lost try (a few
/// slow writes in a row; one is an outlier, and the next normal write brings the cost back
/// down), the wait is back to the shortest, so the next write tries the other kind (if a
/// period has passed since the last try).
#[derive(Debug)]
pub struct StoreChoice {
    /// Time base of the exploration clock.
    epoch: Instant,
    classes: [SizeClass; StoreChoice::CLASSES],
}

/// What [`StoreChoice`] knows about the writes of one size class. Statistics only: relaxed
/// atomics, no ordering relied on.
#[derive(Debug)]
struct SizeClass {
    /// Cost of each kind, picoseconds per byte, `[plain, streaming]`; 0 while not measured.
    cost: [AtomicU64; 2],
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
const PLAIN: usize = 0;
const STREAMING: usize = 1;

impl Default for StoreChoice {
    /// A choice by the writer's time alone.
    fn default() -> StoreChoice {
        StoreChoice::new(1)
    }
}

impl StoreChoice {
    /// Writes from this size are timed and may use streaming stores.
    pub const MIN_BYTES: usize = 64 << 10;
    /// The shortest wait between two tries of the kind that is not a size class's choice.
    pub const EXPLORE_PERIOD: Duration = Duration::from_millis(10);
    /// The longest wait between two tries, reached after seven tries lost by far.
    pub const EXPLORE_PERIOD_MAX: Duration = Duration::from_millis(1280);
    /// A try loses by far when it costs more than this many times the choice's cost.
    pub const LOSS: u64 = 2;
    /// The choice's cost rising to more than this many times what it was when a try last lost
    /// signals a change of state: the next try is due after the shortest wait.
    pub const JUMP: u64 = 3;
    /// Size classes: `[64 KiB, 128 KiB)`, …, the last one from 8 MiB up.
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
        if len < Self::MIN_BYTES {
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
    fn class_of(len: usize) -> usize {
        ((len / Self::MIN_BYTES).ilog2() as usize).min(Self::CLASSES - 1)
    }

    /// `t` in nanoseconds since the epoch.
    fn nanos(&self, t: Instant) -> u64 {
        t.duration_since(self.epoch).as_nanos() as u64
    }
}

/// The kind one write uses, and whether it is a try of the kind that is not the choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pick {
    kind: usize,
    trying: bool,
}

impl SizeClass {
    /// A class that knows nothing yet, streaming counted `streaming_weight` times.
    fn new(streaming_weight: u64) -> SizeClass {
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
    fn pick(&self, now: u64) -> Pick {
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
    fn record(&self, pick: Pick, len: usize, took: Duration) {
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

/// A copy with streaming stores from `min` bytes and the vector loop from [`VECTOR_MIN`]
/// (where the CPU has AVX2), else `memcpy`.
///
/// # Safety
/// As [`copy`].
unsafe fn copy_streaming_from(dst: *mut u8, src: *const u8, len: usize, min: usize) {
    let stream = len >= min.max(VECTOR_MIN);
    // SAFETY: forwarded.
    unsafe { copy_unfenced(dst, src, len, stream) };
    if stream {
        fence();
    }
}

/// A copy with the vector loop (where the CPU has AVX2) from [`VECTOR_MIN`] bytes or wherever
/// `stream` asks for streaming stores, else `memcpy`; streamed without the closing [`fence`].
///
/// # Safety
/// As [`copy`]; where `stream`, the caller runs [`fence`] before anything that must see the
/// bytes.
pub(crate) unsafe fn copy_unfenced(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if (stream || len >= VECTOR_MIN) && can_stream() {
        // SAFETY: AVX2 is present (checked above); the ranges are the caller's.
        unsafe {
            if stream {
                vector_avx2::<true>(dst, src, len)
            } else {
                vector_avx2::<false>(dst, src, len)
            }
        };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Bytes of the blocks in which [`tee`] copies: a block goes to the first destination, then,
/// read again from the L1 cache, to the second.
pub const TEE_BLOCK: usize = 8 << 10;

/// The store choice of tees that write for a peer (their time covers two destinations, so
/// they keep their own costs).
static TEE_TO_PEER: std::sync::LazyLock<SharedCopy> = std::sync::LazyLock::new(SharedCopy::default);

/// Copies `len` bytes from `src` to both destinations, each stored for who reads it next as
/// [`copy`], [`copy_out`] and [`copy_to_peer`] store it ([`CopyTo`]), reading the source
/// once: block by block ([`TEE_BLOCK`]), the second copy of a block reads it from the L1 cache.
/// Two copies of a 512 KiB source, cache-resident, read it twice from the L2 or L3 cache.
///
/// # Safety
/// As [`copy`] for each destination; the two destinations are disjoint.
pub unsafe fn tee(dsts: [(*mut u8, CopyTo); 2], src: *const u8, len: usize) {
    with_tee_choice(dsts.map(|(_, to)| to), len, |stream| {
        let mut off = 0;
        while off < len {
            let n = TEE_BLOCK.min(len - off);
            for ((dst, _), stream) in dsts.iter().zip(stream) {
                // SAFETY: `off + n <= len`: inside the caller's ranges.
                unsafe { copy_unfenced(dst.add(off), src.add(off), n, stream) };
            }
            off += n;
        }
    });
}

/// Runs `write` of `len` bytes to destinations stored for `tos`, passing whether each one
/// streams (as [`copy_to`] decides; for [`CopyTo::Peer`] by the store choice of tees), and
/// fences after it where one streamed. `write` copies with [`copy_unfenced`].
pub(crate) fn with_tee_choice<const N: usize>(
    tos: [CopyTo; N],
    len: usize,
    write: impl FnOnce([bool; N]),
) {
    let run = |peer_streams: bool| {
        let stream = tos.map(|to| match to {
            CopyTo::Local => len >= STREAM_MIN,
            CopyTo::Output => len >= STREAM_OUT_MIN,
            CopyTo::Peer => peer_streams,
        });
        write(stream);
        if stream.contains(&true) {
            fence();
        }
    };
    if tos.contains(&CopyTo::Peer) {
        TEE_TO_PEER.stores.run(len, run);
    } else {
        run(false);
    }
}

/// The vector copy: a plain copy up to the first 32-byte boundary of `dst`, aligned 32-byte
/// stores (four per loop; streaming ones when `STREAM`, which the caller then [`fence`]s), and
/// a plain copy of the tail.
///
/// # Safety
/// The CPU supports AVX2; the ranges as for [`copy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vector_avx2<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_stream_si256};
    const V: usize = 32;
    /// One aligned 32-byte store, streaming when `STREAM`.
    ///
    /// # Safety
    /// AVX2 is present; `d` is 32-byte aligned and valid for 32 bytes of writes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store<const STREAM: bool>(d: *mut __m256i, v: __m256i) {
        // SAFETY: the function's contract.
        unsafe {
            if STREAM {
                _mm256_stream_si256(d, v)
            } else {
                _mm256_store_si256(d, v)
            }
        }
    }
    let head = dst.align_offset(V).min(len);
    // SAFETY: `head <= len`, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    // In both loops `dst + i` is 32-byte aligned (the head brought it there, and `i` moves in
    // multiples of 32), as the aligned and streaming stores require; loads may be unaligned.
    while i + 4 * V <= len {
        // SAFETY: `i + 4 * V <= len`: the four loads and stores lie inside the caller's
        // ranges; alignment as above.
        unsafe {
            let s = src.add(i).cast::<__m256i>();
            let d = dst.add(i).cast::<__m256i>();
            let (a, b, c, e) = (
                _mm256_loadu_si256(s),
                _mm256_loadu_si256(s.add(1)),
                _mm256_loadu_si256(s.add(2)),
                _mm256_loadu_si256(s.add(3)),
            );
            store::<STREAM>(d, a);
            store::<STREAM>(d.add(1), b);
            store::<STREAM>(d.add(2), c);
            store::<STREAM>(d.add(3), e);
        }
        i += 4 * V;
    }
    while i + V <= len {
        // SAFETY: `i + V <= len`; alignment as above.
        unsafe { store::<STREAM>(dst.add(i).cast(), _mm256_loadu_si256(src.add(i).cast())) };
        i += V;
    }
    // SAFETY: `i <= len`: the rest of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
}

/// Whether [`copy_unfenced`] can stream (x86-64 with AVX2).
pub(crate) fn can_stream() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Orders streaming stores (which are weakly ordered) before every later store, as a release
/// store after a plain copy would be: a completion flag another process polls must not become
/// visible before the data.
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, in the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` (a copy) at every offset of source and destination within a cache line and at
    /// lengths around the thresholds and vector boundaries: the copy must be exact and write
    /// nothing outside.
    fn check_exact(name: &str, f: &dyn Fn(*mut u8, *const u8, usize)) {
        let max = STREAM_MIN + 300;
        let src: Vec<u8> = (0..max + 64).map(|i| (i * 7 + 3) as u8).collect();
        for len in [
            0,
            1,
            31,
            32,
            127,
            129,
            VECTOR_MIN - 1,
            VECTOR_MIN,
            VECTOR_MIN + 33,
            StoreChoice::MIN_BYTES + 65,
            STREAM_OUT_MIN + 1,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 33,
            max,
        ] {
            for (so, dof) in [(0, 0), (1, 0), (0, 5), (17, 31), (63, 1)] {
                let mut dst = vec![0xEEu8; max + 128];
                f(dst[dof..].as_mut_ptr(), src[so..].as_ptr(), len);
                assert_eq!(
                    &dst[dof..dof + len],
                    &src[so..so + len],
                    "{name}: len {len} at {so}/{dof}"
                );
                assert!(
                    dst[..dof].iter().all(|&b| b == 0xEE),
                    "{name}: before, {len}"
                );
                assert!(
                    dst[dof + len..].iter().all(|&b| b == 0xEE),
                    "{name}: after, {len}"
                );
            }
        }
    }

    #[test]
    fn every_copy_is_exact_at_any_alignment() {
        // SAFETY (all closures): `check_exact` passes ranges inside two disjoint vectors.
        check_exact("copy", &|d, s, n| unsafe { copy(d, s, n) });
        check_exact("copy_out", &|d, s, n| unsafe { copy_out(d, s, n) });
        for kind in [PLAIN, STREAMING] {
            // Make `kind` the cheaper one; exploring copies take the other: both run.
            let shared = SharedCopy::default();
            for class in &shared.stores.classes {
                class.cost[kind].store(1, Ordering::Relaxed);
                class.cost[1 - kind].store(1000, Ordering::Relaxed);
            }
            check_exact("SharedCopy", &|d, s, n| unsafe { shared.copy(d, s, n) });
        }
    }

    /// A tee writes both destinations exactly, whatever each one's store kind, also where the
    /// two are aligned differently.
    #[test]
    fn a_tee_is_exact_into_both_destinations() {
        use CopyTo::{Local, Output, Peer};
        for (first, second) in [(Local, Output), (Output, Peer), (Peer, Local)] {
            for shift in [0, 1, 33] {
                check_exact("tee", &|d, s, n| {
                    let mut other = vec![0u8; n + shift];
                    // SAFETY: `d`, `s` as `check_exact` passes them; `other` holds `n` bytes
                    // from `shift` and is disjoint from both.
                    unsafe { tee([(d, first), (other[shift..].as_mut_ptr(), second)], s, n) };
                    // SAFETY: `s` is valid for `n` reads.
                    let src = unsafe { std::slice::from_raw_parts(s, n) };
                    assert!(
                        other[shift..] == *src,
                        "tee's second destination, {n} bytes"
                    );
                });
            }
        }
    }

    const MIB: usize = 1 << 20;
    /// A write of the choice, `kind`.
    const fn serving(kind: usize) -> Pick {
        Pick {
            kind,
            trying: false,
        }
    }
    /// A try of `kind`, which is not the choice.
    const fn trying(kind: usize) -> Pick {
        Pick { kind, trying: true }
    }

    /// Plain stores first, streaming ones on the next copy, then the cheaper kind, the other
    /// one once per exploration period while the two are close.
    #[test]
    fn a_size_class_takes_the_cheaper_kind_and_keeps_trying_the_other() {
        let c = SizeClass::new(1);
        let period = StoreChoice::EXPLORE_PERIOD.as_nanos() as u64;
        assert_eq!(c.pick(0), serving(PLAIN));
        c.record(serving(PLAIN), MIB, Duration::from_micros(30));
        assert_eq!(c.pick(1), trying(STREAMING));
        // Dearer, but within `LOSS` times plain: tried again after the shortest wait.
        c.record(trying(STREAMING), MIB, Duration::from_micros(55));
        assert_eq!(
            (c.pick(2), c.pick(period / 2)),
            (serving(PLAIN), serving(PLAIN))
        );
        assert_eq!(
            (c.pick(period + 1), c.pick(period + 2)),
            (trying(STREAMING), serving(PLAIN))
        );
        c.record(trying(STREAMING), MIB, Duration::from_micros(55));
        // The plain stores turn slow (the host moved the cores apart): two slow copies make
        // streaming the choice ...
        c.record(serving(PLAIN), MIB, Duration::from_micros(400));
        assert_eq!(c.pick(period + 3), serving(PLAIN));
        c.record(serving(PLAIN), MIB, Duration::from_micros(400));
        assert_eq!(c.pick(period + 4), serving(STREAMING));
        // ... and one fast plain copy at the next try makes plain the choice again.
        assert_eq!(c.pick(3 * period), trying(PLAIN));
        c.record(trying(PLAIN), MIB, Duration::from_micros(31));
        assert_eq!(c.pick(3 * period + 1), serving(PLAIN));
    }

    /// The first try at or after `from` (ns), stepping a millisecond at a time.
    fn next_try(c: &SizeClass, from: u64) -> u64 {
        (0..)
            .map(|i| from + i * 1_000_000)
            .find(|&t| c.pick(t).trying)
            .unwrap()
    }

    /// Each try that loses by far doubles the wait before the next one, up to the longest; the
    /// choice's cost rising to `JUMP` times what it was at the last lost try brings the wait
    /// back to the shortest, a single slow write does not.
    #[test]
    fn tries_that_lose_by_far_back_off_until_the_choice_jumps() {
        let c = SizeClass::new(1);
        let ms = 1_000_000;
        c.record(c.pick(0), MIB, Duration::from_micros(21));
        let mut last = next_try(&c, 1);
        let mut waits = vec![];
        for _ in 0..9 {
            c.record(trying(STREAMING), MIB, Duration::from_micros(500));
            let t = next_try(&c, last);
            waits.push((t - last) / ms);
            last = t;
        }
        assert_eq!(waits, [20, 40, 80, 160, 320, 640, 1280, 1280, 1280]);
        assert_eq!(
            StoreChoice::EXPLORE_PERIOD_MAX.as_millis(),
            1280,
            "the documented seven doublings"
        );
        c.record(trying(STREAMING), MIB, Duration::from_micros(500));
        // One slow write of the choice is an outlier ...
        let slow = Duration::from_micros(210);
        for took in [slow, Duration::from_micros(21)] {
            c.record(serving(PLAIN), MIB, took);
        }
        let t = next_try(&c, last);
        assert_eq!(t - last, 1280 * ms);
        last = t;
        c.record(trying(STREAMING), MIB, Duration::from_micros(500));
        // ... two in a row a change of state: the next try comes after the shortest wait.
        c.record(serving(PLAIN), MIB, slow);
        c.record(serving(PLAIN), MIB, slow);
        assert_eq!(next_try(&c, last) - last, 10 * ms);
    }

    /// A kind counted twice wins only where it costs less than half the other's, and its
    /// tries lose by far from half of that (`LOSS`) on.
    #[test]
    fn a_weighted_kind_counts_its_cost_times_the_weight() {
        for (weight, wait) in [(1, 10), (2, 20)] {
            let c = SizeClass::new(weight);
            c.record(c.pick(0), MIB, Duration::from_micros(30)); // 28 ps/B
            let t = next_try(&c, 1);
            c.record(trying(STREAMING), MIB, Duration::from_micros(45)); // 42 ps/B
            assert_eq!(next_try(&c, t) - t, wait * 1_000_000, "weight {weight}");
        }
        let c = SizeClass::new(2);
        c.record(c.pick(0), MIB, Duration::from_micros(30));
        c.record(c.pick(1), MIB, Duration::from_micros(20)); // 19 ps/B, counted 38
        assert_eq!(c.pick(2), serving(PLAIN));
        c.record(trying(STREAMING), MIB, Duration::from_micros(13)); // 12 ps/B, counted 24
        assert_eq!(c.pick(3), serving(STREAMING));
    }

    /// Costs are picoseconds per byte; a lower sample replaces the cost, a higher one moves it
    /// a quarter of the way, counting at most four times the cost.
    #[test]
    fn costs_fall_at_once_and_rise_slowly() {
        let c = SizeClass::new(1);
        c.record(serving(PLAIN), 1000, Duration::from_nanos(100));
        assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 100);
        c.record(serving(PLAIN), 1000, Duration::from_nanos(300));
        assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 150);
        c.record(serving(PLAIN), 1000, Duration::from_millis(5));
        assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 150 + 450 / 4);
        c.record(serving(PLAIN), 1000, Duration::from_nanos(50));
        assert_eq!(c.cost[PLAIN].load(Ordering::Relaxed), 50);
        assert_eq!(c.cost[STREAMING].load(Ordering::Relaxed), 0);
    }

    #[test]
    fn size_classes_are_powers_of_two_from_the_minimum() {
        let m = StoreChoice::MIN_BYTES;
        let classes: Vec<usize> = [m, 2 * m - 1, 2 * m, 4 * m, 100 * m, usize::MAX]
            .map(StoreChoice::class_of)
            .into();
        assert_eq!(classes, [0, 0, 1, 2, 6, 7]);
    }
}
