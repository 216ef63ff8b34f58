//! Domains and communicators, as in the AMP-CCL design.
//!
//! A **domain** is what the ranks of one communicator share on one host: a key derived from
//! the communicator's unique id (the same on every rank), the shared staging area (a
//! rendezvous segment named after the key) and, once registered with the driver, its
//! [`HostArea`]. Domains outlive their communicators (a later communicator of the same key,
//! e.g. after a restart of a process group, finds it again).
//!
//! Host identity: every rank *arrives* in the domain's segment before it calls NCCL's init.
//! NCCL's init returns on no rank before every rank has entered it, so once a communicator
//! exists the arrival count is final: it equals `nranks` exactly when every rank shares this
//! host (and this `/dev/shm`). Otherwise the communicator stays fast-only — on every rank
//! alike, since no host can see all ranks arrive.
//!
//! The segment also holds the domain's parameter store ([`ShmParamStore`]): the learned split
//! table (rank 0 aggregates every rank's measurements and runs the controller) and the decision
//! ring through which every rank uses the same split for each call.
//!
//! A **communicator** entry ([`CommState`]) maps NCCL's handle to its domain, rank, device,
//! PCIe resources ([`PcieRank`]) and parameter store handle, set up once NCCL has made the
//! communicator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ampccl_multipath::pcie::{HeaderRef, HostArea, Layout, PcieRank, RankStatus};
use ampccl_multipath::schedule;
use ampccl_multipath::store::{Aggregator, Region, ShmParamStore};
use ampccl_runtime::cuda::{self, Device};
use ampccl_transport::shm::segment::Segment;

use crate::config::settings;
use crate::nccl;

/// The domain key of a communicator made from `id` for `nranks` ranks.
pub fn key_of_id(id: &nccl::UniqueId, nranks: usize) -> u64 {
    mix(fnv1a(&id.internal), nranks as u64)
}

/// The domain key of the communicator that `color` gets from the `seq`-th split of `parent`.
pub fn key_of_split(parent: u64, seq: u64, color: i32) -> u64 {
    mix(mix(parent, seq), color as u32 as u64)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// What the ranks of a communicator share on this host.
pub struct Domain {
    pub key: u64,
    /// Ranks the domain can hold (a split child may have fewer).
    pub nranks: usize,
    layout: Layout,
    segment: Arc<Segment>,
    area: OnceLock<Result<Arc<HostArea>, String>>,
}

/// Timed calls of a key whose measurements only warm up (see [`Paths::seen`]).
pub const WARMUP_CALLS: u32 = 2;

/// Keys the parameter table of a domain can hold.
const TABLE_ENTRIES: usize = 256;

impl Domain {
    fn header(&self) -> HeaderRef<'_> {
        // SAFETY: the segment is page-aligned, at least `layout.total()` long, lives as long as
        // `self`, and its header is only accessed through atomics.
        unsafe { HeaderRef::new(self.segment.as_ptr()) }
    }

    /// Whether every one of a communicator's `nranks` ranks arrived on this host.
    pub fn all_local(&self, nranks: usize) -> bool {
        self.header().arrivals() as usize == nranks
    }

    /// Whether every one of a communicator's `nranks` ranks set up its PCIe path (never
    /// waits: a rank not yet done counts as not ready).
    pub fn all_ready(&self, nranks: usize) -> bool {
        let h = self.header();
        (0..nranks).all(|r| h.status(r) == RankStatus::Ready)
    }

    /// This rank's handle on the domain's parameter store, created by the first rank to get
    /// here for a communicator of `nranks` ranks.
    fn store(&self, nranks: usize, rank: usize) -> Result<ShmParamStore, String> {
        let off = self.layout.total();
        let len = ShmParamStore::bytes_needed(self.nranks, TABLE_ENTRIES);
        let keep: ampccl_runtime::doorbell::Keepalive = self.segment.clone();
        // SAFETY: `off` is page-aligned inside the mapping (see `arrive`), which `keep` keeps
        // mapped; the region is zero or holds a store, and is only used through stores.
        let region =
            || unsafe { Region::from_raw(self.segment.as_ptr().add(off), len, keep.clone()) };
        let h = self.header();
        if h.claim_store() {
            let layout = ampccl_multipath::store::Layout::new(nranks, TABLE_ENTRIES);
            let created = region().and_then(|r| ShmParamStore::create(r, layout, rank));
            h.store_initialised();
            return created.map_err(|e| e.to_string());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !h.store_is_initialised() {
            if Instant::now() > deadline {
                return Err("the parameter store was never initialised".into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        region()
            .and_then(|r| ShmParamStore::attach(r, rank))
            .map_err(|e| e.to_string())
    }

    /// The registered staging area (registered once per process, in `device`'s context).
    fn area(&self, device: &Device) -> Result<Arc<HostArea>, String> {
        self.area
            .get_or_init(|| {
                let _ctx = device.enter().map_err(|e| e.to_string())?;
                // SAFETY: the segment maps `layout.total()` page-aligned bytes and lives as long
                // as the domain, which the area's users keep alive through `Arc<Domain>`.
                unsafe { HostArea::register(self.segment.as_ptr(), self.layout) }
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// Removes the segment's name once NCCL has made a communicator of the domain: NCCL's init
    /// returns on no rank before every rank entered it, and every rank opened the segment
    /// before that, so nobody needs the name any more (mappings stay valid). Idempotent.
    pub fn seal(&self) {
        if let Err(e) = self.segment.unlink() {
            tracing::debug!("ampccl: unlinking {}: {e}", self.segment.name());
        }
    }

    /// After an abort: releases every stream waiting on this domain's flags, on every rank, so
    /// that no user stream stays blocked behind a PCIe part that will never complete.
    pub fn release_waiters(&self) {
        (0..self.nranks).for_each(|r| self.release_flags(r));
    }

    /// The flag word at `off` of the mapping.
    fn flag(&self, off: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: flag offsets lie in the mapping, are 4-byte aligned, and the words are only
        // accessed atomically (by CPUs) or by GPUs through the registration.
        unsafe { &*self.segment.as_ptr().add(off).cast() }
    }

    /// The value rank `r`'s flags are released to ([`HeaderRef::release_target`]): far ahead
    /// ([`schedule::released`]) of where its send stream is now, so that every wait of every
    /// peer, for the calls in flight and any later ones, is satisfied.
    pub fn release_target(&self, r: usize) -> u32 {
        let now = self
            .flag(self.layout.ready_off(r))
            .load(std::sync::atomic::Ordering::Acquire);
        self.header().release_target(r, schedule::released(now))
    }

    /// Releases rank `r`'s flags from the host, now. Only for a rank whose streams will write
    /// no more (aborted, or unable to enqueue anything): a stream write queued earlier would
    /// move the flag back ([`PcieRank::release_flags`] releases in stream order).
    fn release_flags(&self, r: usize) {
        let target = self.release_target(r);
        for off in [self.layout.ready_off(r), self.layout.consumed_off(r)] {
            self.flag(off)
                .store(target, std::sync::atomic::Ordering::Release);
        }
    }
}

static DOMAINS: Mutex<Option<HashMap<u64, Arc<Domain>>>> = Mutex::new(None);

/// The domain `key` of `nranks` ranks, created (segment opened, this rank's arrival counted) if
/// this process has none yet; `arrive` ranks arrive (all local ranks of `ncclCommInitAll` at
/// once). `private` domains (one process holds every rank) use an anonymous segment.
pub fn arrive(
    key: u64,
    nranks: usize,
    arrive: usize,
    private: bool,
) -> Result<Arc<Domain>, String> {
    let s = settings();
    let layout = Layout::new(nranks, s.slots, s.chunk_bytes).map_err(|e| e.to_string())?;
    let total = layout.total() + ShmParamStore::bytes_needed(nranks, TABLE_ENTRIES);
    let mut domains = DOMAINS.lock().unwrap_or_else(|e| e.into_inner());
    let map = domains.get_or_insert_with(HashMap::new);
    let domain = match map.get(&key) {
        Some(d) => d.clone(),
        None => {
            let segment = Arc::new(
                if private {
                    Segment::create(total)
                } else {
                    Segment::open_or_create(&format!("{key:016x}-{nranks}"), total)
                }
                .map_err(|e| e.to_string())?,
            );
            if private {
                segment.unlink().map_err(|e| e.to_string())?;
            }
            let d = Arc::new(Domain {
                key,
                nranks,
                layout,
                segment,
                area: OnceLock::new(),
            });
            map.insert(key, d.clone());
            d
        }
    };
    for _ in 0..arrive {
        domain.header().arrive(&layout).map_err(|e| e.to_string())?;
    }
    Ok(domain)
}

/// PCIe state of one communicator.
pub enum Pcie {
    /// Not set up yet (NCCL has not finished making the communicator).
    Pending,
    /// Set up here; `all_ready` once every rank has been seen set up.
    Ready {
        rank: Box<PcieRank>,
        all_ready: bool,
    },
    /// Fast-only, for the reason given (logged once). `retired`: the resources of a path that
    /// was on, kept until the communicator is destroyed (their streams may still run calls in
    /// flight, which may wait for peers whose host has not issued them yet: dropping them here
    /// would block this thread on those peers).
    Off {
        why: String,
        retired: Option<Box<PcieRank>>,
    },
}

impl Pcie {
    /// Off for `why`, never having been on.
    pub fn off(why: String) -> Pcie {
        Pcie::Off { why, retired: None }
    }

    /// Turns the path off for `why`, keeping its resources (see [`Pcie::Off`]).
    pub fn turn_off(&mut self, why: String) {
        let retired = match std::mem::replace(self, Pcie::Pending) {
            Pcie::Ready { rank, .. } => Some(rank),
            Pcie::Off { retired, .. } => retired,
            Pcie::Pending => None,
        };
        *self = Pcie::Off { why, retired };
    }

    /// The PCIe resources, on or retired.
    pub fn rank(&self) -> Option<&PcieRank> {
        match self {
            Pcie::Ready { rank, .. }
            | Pcie::Off {
                retired: Some(rank),
                ..
            } => Some(rank),
            _ => None,
        }
    }
}

/// What a communicator's calls need under its lock.
pub struct Paths {
    pub pcie: Pcie,
    /// The domain's parameter store (absent: every call fast-only).
    pub store: Option<ShmParamStore>,
    /// Rank 0 folds the ranks' measurements into the table.
    pub aggregator: Option<Aggregator>,
    /// Index of the next split-worthy call (the same sequence on every rank).
    pub next_call: u64,
    /// Split-worthy calls per key so far (the same on every rank): which are reference calls.
    pub calls: HashMap<ampccl_multipath::key::OpKey, u64>,
    /// Timed calls per key so far; the first [`WARMUP_CALLS`] of a key are not fed to the
    /// controller (they carry one-time costs such as NCCL connecting peers).
    pub seen: HashMap<ampccl_multipath::key::OpKey, u32>,
    /// Calls whose timing is pending: call index → (key, NCCL bytes, PCIe bytes).
    pub inflight: HashMap<u64, (ampccl_multipath::key::OpKey, u64, u64)>,
    /// Measured times of the timed calls (for `AMPCCL_REPORT`).
    pub tally: crate::report::Tally,
    /// The configured controller, for the initial split of keys the table does not hold yet.
    pub initial: Box<dyn ampccl_multipath::controller::Controller>,
}

/// One communicator the interposer knows.
pub struct CommState {
    pub domain: Arc<Domain>,
    pub rank: usize,
    pub nranks: usize,
    /// Splits of this communicator so far (keys of the children).
    pub splits: std::sync::atomic::AtomicU64,
    pub paths: Mutex<Paths>,
}

static COMMS: RwLock<Option<HashMap<usize, Arc<CommState>>>> = RwLock::new(None);

/// The state of `comm`, if the interposer registered it.
pub fn lookup(comm: nccl::Comm) -> Option<Arc<CommState>> {
    COMMS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .get(&(comm as usize))
        .cloned()
}

/// Registers `comm` (rank `rank` of `nranks` in `domain`).
pub fn register(
    comm: nccl::Comm,
    domain: Arc<Domain>,
    rank: usize,
    nranks: usize,
) -> Arc<CommState> {
    let st = Arc::new(CommState {
        domain,
        rank,
        nranks,
        splits: std::sync::atomic::AtomicU64::new(0),
        paths: Mutex::new(Paths {
            pcie: Pcie::Pending,
            store: None,
            aggregator: None,
            next_call: 0,
            calls: HashMap::new(),
            inflight: HashMap::new(),
            seen: HashMap::new(),
            tally: Default::default(),
            initial: settings().mp.controller(),
        }),
    });
    tracing::debug!(comm = ?comm, rank, nranks, key = st.domain.key, "communicator registered");
    COMMS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(comm as usize, st.clone());
    st
}

/// Forgets `comm`, returning its state.
pub fn unregister(comm: nccl::Comm) -> Option<Arc<CommState>> {
    COMMS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()?
        .remove(&(comm as usize))
}

impl CommState {
    /// Locks the communicator's paths.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Paths> {
        self.paths.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// At destroy: collects the last timings, saves the learned table (`AMPCCL_PARAM_FILE`,
    /// rank 0) and prints the report (`AMPCCL_REPORT=1`).
    pub fn finish(&self) {
        self.domain.seal();
        let mut p = self.lock();
        if let Pcie::Ready { rank, .. } = &mut p.pcie {
            // Destroy may block: let the last calls finish so that they are counted.
            rank.wait_idle();
        }
        crate::split::collect(&mut p, self.rank);
        let p = &mut *p;
        let Some(store) = p.store.as_ref() else {
            return;
        };
        let s = settings();
        if self.rank == 0 {
            if let Some(agg) = p.aggregator.as_mut() {
                let _ = agg.poll(store);
            }
            if let Some(path) = &s.mp.param_file
                && let Err(e) =
                    ampccl_multipath::persist::save(path, self.nranks, &store.snapshot())
            {
                tracing::warn!("ampccl: saving {}: {e}", path.display());
            }
        }
        if s.mp.report {
            eprint!("{}", p.tally.render(self.rank));
            if self.rank == 0 {
                eprint!(
                    "{}",
                    ampccl_multipath::report(&s.mp.algo, &store.snapshot())
                );
            }
        }
    }

    /// Sets up this rank's parameter store handle and PCIe path on `device` (or off, for the
    /// reason given), and publishes the outcome to the domain.
    pub fn setup(&self, device: Result<i32, String>) {
        self.domain.seal();
        let mut p = self.lock();
        if !matches!(p.pcie, Pcie::Pending) {
            return;
        }
        match self.domain.store(self.nranks, self.rank) {
            Ok(store) => {
                if self.rank == 0 {
                    let mut agg = Aggregator::new(settings().mp.controller());
                    if let Some(saved) = settings()
                        .mp
                        .param_file
                        .as_ref()
                        .and_then(|f| ampccl_multipath::persist::load(f, self.nranks))
                    {
                        let _ = agg.seed(&store, &saved);
                    }
                    p.aggregator = Some(agg);
                }
                p.store = Some(store);
            }
            Err(e) => tracing::info!(
                rank = self.rank,
                "ampccl: no parameter store, fast-only: {e}"
            ),
        }
        let outcome = if p.store.is_some() {
            self.try_setup(device)
        } else {
            Err("no parameter store".into())
        };
        let header = self.domain.header();
        p.pcie = match outcome {
            Ok(mut rank) => {
                if let Some((r, steps)) = settings().fault
                    && r == self.rank
                {
                    rank.inject_fault_after(steps);
                }
                header.set_status(self.rank, RankStatus::Ready);
                Pcie::Ready {
                    rank: Box::new(rank),
                    all_ready: false,
                }
            }
            Err(why) => {
                header.set_status(self.rank, RankStatus::Failed);
                tracing::info!(
                    rank = self.rank,
                    "ampccl: PCIe path off for this communicator: {why}"
                );
                Pcie::off(why)
            }
        };
    }

    fn try_setup(&self, device: Result<i32, String>) -> Result<PcieRank, String> {
        if !settings().pcie {
            return Err("AMPCCL_ENABLE_PCIE=0".into());
        }
        if self.nranks < 2 || self.nranks > cuda::MAX_SOURCES {
            return Err(format!(
                "{} ranks (the PCIe path serves 2..={})",
                self.nranks,
                cuda::MAX_SOURCES
            ));
        }
        if !cuda::available() {
            return Err("no CUDA driver".into());
        }
        let device = device?;
        let dev = Device::new(device).map_err(|e| e.to_string())?;
        let area = self.domain.area(&dev)?;
        PcieRank::new(area, device, self.rank, self.nranks).map_err(|e| e.to_string())
    }

    /// After this rank could not do its PCIe part of a split the ranks agreed on: turns its
    /// path off for good and releases its flags after whatever it enqueued (in stream order,
    /// [`PcieRank::release_flags`]; from the host when it has no streams or they fail), so no
    /// peer's stream waits for chunks that will never come. Unless another rank broke first,
    /// its status says `Broken`: every rank goes fast-only and reports the failure through
    /// `ncclCommGetAsyncError` (results of the calls in flight are undefined, as after any
    /// asynchronous NCCL error; the application aborts the communicator). Never waits.
    pub fn break_pcie(&self, pcie: &mut Pcie, why: String) {
        tracing::error!(
            rank = self.rank,
            "ampccl: PCIe path off for this communicator, the call's result is undefined: {why}"
        );
        pcie.turn_off(why);
        let target = self.domain.release_target(self.rank);
        match pcie.rank().map(|r| r.release_flags(target)) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(
                    rank = self.rank,
                    "ampccl: releasing the flags in stream order: {e}"
                );
                self.domain.release_flags(self.rank);
            }
            None => self.domain.release_flags(self.rank),
        }
        if self.broken_rank().is_none() {
            self.domain
                .header()
                .set_status(self.rank, RankStatus::Broken);
        }
    }

    /// The rank whose PCIe part failed during a call, if any (see [`CommState::break_pcie`]).
    pub fn broken_rank(&self) -> Option<usize> {
        let h = self.domain.header();
        (0..self.nranks).find(|&r| h.status(r) == RankStatus::Broken)
    }

    /// Whether this rank can propose a split: set up here, every rank on this host and every
    /// rank's set-up done and successful (never waits).
    pub fn can_split(&self, pcie: &mut Pcie) -> bool {
        let Pcie::Ready { all_ready, .. } = pcie else {
            return false;
        };
        if *all_ready {
            let Some(r) = self.broken_rank() else {
                return true;
            };
            pcie.turn_off(format!("rank {r}'s PCIe part failed during a call"));
            return false;
        }
        if !self.domain.all_local(self.nranks) {
            pcie.turn_off("ranks on other hosts".into());
            tracing::info!(
                rank = self.rank,
                "ampccl: PCIe path off for this communicator: ranks on other hosts"
            );
            return false;
        }
        let h = self.domain.header();
        if let Some(r) = (0..self.nranks)
            .find(|&r| h.status(r) != RankStatus::Ready && h.status(r) != RankStatus::Unknown)
        {
            let why = format!("rank {r} could not set up or lost its PCIe path");
            tracing::info!(
                rank = self.rank,
                "ampccl: PCIe path off for this communicator: {why}"
            );
            pcie.turn_off(why);
            return false;
        }
        *all_ready = self.domain.all_ready(self.nranks);
        if *all_ready {
            tracing::info!(
                rank = self.rank,
                nranks = self.nranks,
                "ampccl: PCIe path on"
            );
        }
        *all_ready
    }
}
