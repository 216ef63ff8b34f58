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
//! A **communicator** entry ([`CommState`]) maps NCCL's handle to its domain, rank, device and
//! PCIe resources ([`PcieRank`]), set up once NCCL has made the communicator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ampccl::multipath::pcie::{HeaderRef, HostArea, Layout, PcieRank, RankStatus};
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
    pub nranks: usize,
    layout: Layout,
    segment: Segment,
    area: OnceLock<Result<Arc<HostArea>, String>>,
}

impl Domain {
    fn header(&self) -> HeaderRef<'_> {
        // SAFETY: the segment is page-aligned, at least `layout.total()` long, lives as long as
        // `self`, and its header is only accessed through atomics.
        unsafe { HeaderRef::new(self.segment.as_ptr()) }
    }

    /// Whether every rank of the domain arrived on this host.
    pub fn all_local(&self) -> bool {
        self.header().arrivals() as usize == self.nranks
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

    /// After an abort: releases every stream waiting on this domain's flags, on every rank, so
    /// that no user stream stays blocked behind a PCIe part that will never complete.
    pub fn release_waiters(&self) {
        let base = self.segment.as_ptr();
        for r in 0..self.nranks {
            for off in [self.layout.ready_off(r), self.layout.consumed_off(r)] {
                // SAFETY: the flag words lie in the mapping, are 4-byte aligned and are only
                // accessed atomically (by CPUs) or by GPUs through the registration.
                let flag = unsafe { &*base.add(off).cast::<std::sync::atomic::AtomicU32>() };
                flag.store(u32::MAX, std::sync::atomic::Ordering::Release);
            }
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
    let mut domains = DOMAINS.lock().unwrap_or_else(|e| e.into_inner());
    let map = domains.get_or_insert_with(HashMap::new);
    let domain = match map.get(&key) {
        Some(d) => d.clone(),
        None => {
            let segment = if private {
                Segment::create(layout.total())
            } else {
                Segment::open_or_create(&format!("{key:016x}-{nranks}"), layout.total())
            }
            .map_err(|e| e.to_string())?;
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
    /// Set up; `agreed` once every rank has been seen ready.
    Ready { rank: Box<PcieRank>, agreed: bool },
    /// Fast-only, for the reason given (logged once).
    Off(String),
}

/// One communicator the interposer knows.
pub struct CommState {
    pub domain: Arc<Domain>,
    pub rank: usize,
    pub nranks: usize,
    /// Splits of this communicator so far (keys of the children).
    pub splits: std::sync::atomic::AtomicU64,
    pub pcie: Mutex<Pcie>,
    /// Measured times of split calls (for `AMPCCL_REPORT`).
    pub tally: Mutex<crate::report::Tally>,
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
        pcie: Mutex::new(Pcie::Pending),
        tally: Mutex::new(Default::default()),
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
    /// Collects the timings of completed calls and, with `AMPCCL_REPORT=1`, prints the table.
    pub fn report(&self) {
        let mut pcie = self.pcie.lock().unwrap_or_else(|e| e.into_inner());
        if let Pcie::Ready { rank, .. } = &mut *pcie {
            let mut done = Vec::new();
            // Destroy may block: let the last calls finish so that they are counted.
            rank.wait_idle();
            rank.poll_timings(&mut done);
            self.tally
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(&done);
        }
        if settings().report {
            eprint!(
                "{}",
                self.tally
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .render(self.rank)
            );
        }
    }

    /// Sets up the PCIe path of this rank on `device` and publishes the outcome to the domain.
    pub fn setup(&self, device: i32) {
        let mut pcie = self.pcie.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(*pcie, Pcie::Pending) {
            return;
        }
        let outcome = self.try_setup(device);
        let header = self.domain.header();
        *pcie = match outcome {
            Ok(rank) => {
                header.set_status(self.rank, RankStatus::Ready);
                Pcie::Ready {
                    rank: Box::new(rank),
                    agreed: false,
                }
            }
            Err(why) => {
                header.set_status(self.rank, RankStatus::Failed);
                tracing::info!(
                    rank = self.rank,
                    "ampccl: PCIe path off for this communicator: {why}"
                );
                Pcie::Off(why)
            }
        };
    }

    fn try_setup(&self, device: i32) -> Result<PcieRank, String> {
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
        let dev = Device::new(device).map_err(|e| e.to_string())?;
        let area = self.domain.area(&dev)?;
        PcieRank::new(area, device, self.rank, self.nranks).map_err(|e| e.to_string())
    }

    /// Whether this call may use the PCIe path: set up here, every rank on this host and every
    /// rank's set-up succeeded. The first time, waits (bounded) for the peers' set-up to be
    /// published.
    pub fn agree(pcie: &mut Pcie, st: &CommState) -> bool {
        let Pcie::Ready { agreed, .. } = pcie else {
            return false;
        };
        if *agreed {
            return true;
        }
        let verdict = (|| {
            if !st.domain.all_local() {
                return Err("ranks on other hosts".to_string());
            }
            let header = st.domain.header();
            let deadline = Instant::now() + Duration::from_secs(60);
            for r in 0..st.nranks {
                loop {
                    match header.status(r) {
                        RankStatus::Ready => break,
                        RankStatus::Failed => {
                            return Err(format!("rank {r} could not set up its PCIe path"));
                        }
                        RankStatus::Unknown if Instant::now() > deadline => {
                            return Err(format!("rank {r} never published its PCIe set-up"));
                        }
                        RankStatus::Unknown => std::thread::sleep(Duration::from_micros(100)),
                    }
                }
            }
            Ok(())
        })();
        match verdict {
            Ok(()) => {
                *agreed = true;
                tracing::info!(rank = st.rank, nranks = st.nranks, "ampccl: PCIe path on");
                true
            }
            Err(why) => {
                tracing::info!(
                    rank = st.rank,
                    "ampccl: PCIe path off for this communicator: {why}"
                );
                *pcie = Pcie::Off(why);
                false
            }
        }
    }
}
