//! Setting up the shared-memory device of a communicator.
//!
//! Steps: sweep segments left by crashed processes; create our segment (0600, random name) and
//! fill its header; exchange names through the bootstrap and map every peer's segment; probe
//! cross-memory attach between every pair (all must succeed to use it); barrier, then unlink
//! our name — from here on a crash leaks nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ampccl_runtime::{Error, Result};

use super::device::ShmDevice;
use super::layout::*;
use super::segment::{self, Segment};
use crate::bootstrap::Bootstrap;
use crate::shm::cma;

/// Tunables of the shared-memory device.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Bytes of registered window per rank (the CCL buffers).
    pub window: usize,
    /// Clear-to-send FIFO depth.
    pub depth: usize,
    /// Use cross-memory attach when the probe succeeds.
    pub allow_cma: bool,
    /// The communicator rank of each rank of `boot`, for messages (empty: the same).
    pub names: Vec<usize>,
}

/// Bootstrap tags used during setup.
const TAG_NAMES: u64 = 0x5348_4d00;
const TAG_CMA: u64 = 0x5348_4d01;
const TAG_MAPPED: u64 = 0x5348_4d02;

/// Creates and connects the device for the ranks of `boot` (all on this host).
pub fn connect(boot: &Bootstrap, cfg: &ShmConfig) -> Result<Arc<ShmDevice>> {
    let (rank, world) = (boot.rank(), boot.world());
    if boot.host_ids().iter().any(|h| *h != boot.host_id()) {
        return Err(Error::InvalidUsage(
            "the shared-memory transport needs every rank on one host; ranks on other hosts \
             need the TCP provider (AMPCCL_TRANSPORT=tcp, or leave AMPCCL_TRANSPORT unset)"
                .into(),
        ));
    }
    let swept = segment::sweep_stale();
    if swept > 0 {
        tracing::info!("removed {swept} shared-memory segments of dead processes");
    }
    let layout = Layout {
        world,
        depth: cfg.depth,
        window: cfg.window,
    };
    let own = Arc::new(Segment::create(layout.total())?);
    let v = View {
        base: own.as_ptr(),
        len: own.len(),
    };
    let probe_value: u64 = rand::random::<u64>() | 1;
    v.u64(H_MAGIC).store(MAGIC, Ordering::Relaxed);
    v.u32(H_VERSION).store(VERSION, Ordering::Relaxed);
    v.u32(H_RANK).store(rank as u32, Ordering::Relaxed);
    v.u32(H_WORLD).store(world as u32, Ordering::Relaxed);
    v.u32(H_PID).store(std::process::id(), Ordering::Relaxed);
    v.u64(H_PROBE).store(probe_value, Ordering::Release);

    let result = (|| {
        let mut msg = Vec::new();
        msg.extend_from_slice(&(own.len() as u64).to_le_bytes());
        msg.extend_from_slice(&(v.base as u64 + H_PROBE as u64).to_le_bytes());
        msg.extend_from_slice(&probe_value.to_le_bytes());
        msg.extend_from_slice(own.name().as_bytes());
        let all = boot.allgather(TAG_NAMES, &msg)?;
        let mut segs = Vec::with_capacity(world);
        let mut probes = Vec::with_capacity(world);
        for (r, m) in all.iter().enumerate() {
            if m.len() < 24 {
                return Err(Error::Remote(format!(
                    "rank {r} sent a malformed segment record"
                )));
            }
            let field = |i: usize| u64::from_le_bytes(m[i * 8..i * 8 + 8].try_into().unwrap());
            let (len, probe_addr, value) = (field(0) as usize, field(1) as usize, field(2));
            if len != layout.total() {
                return Err(Error::InvalidUsage(format!(
                    "rank {r} uses a different shared-memory layout (AMPCCL_BUFFSIZE or world \
                     size differ between ranks)"
                )));
            }
            if r == rank {
                segs.push(own.clone());
            } else {
                let name = std::str::from_utf8(&m[24..])
                    .map_err(|_| Error::Remote(format!("rank {r} sent a bad segment name")))?;
                let s = Segment::open(name, len)?;
                let pv = View {
                    base: s.as_ptr(),
                    len: s.len(),
                };
                if pv.u64(H_MAGIC).load(Ordering::Acquire) != MAGIC
                    || pv.u32(H_RANK).load(Ordering::Acquire) as usize != r
                {
                    return Err(Error::Remote(format!(
                        "rank {r}'s segment has a bad header"
                    )));
                }
                segs.push(Arc::new(s));
            }
            probes.push((probe_addr, value));
        }
        // Cross-memory attach must work from us to every peer in another process.
        let pids = boot.pids().to_vec();
        let me_ok = cfg.allow_cma
            && (0..world).all(|r| {
                r == rank || pids[r] == pids[rank] || cma::probe(pids[r], probes[r].0, probes[r].1)
            });
        let oks = boot.allgather(TAG_CMA, &[me_ok as u8])?;
        let cma = oks.iter().all(|o| o.first() == Some(&1));
        boot.barrier(TAG_MAPPED)?;
        own.unlink()?;
        Ok((segs, pids, cma))
    })();
    let (segs, pids, cma) = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = own.unlink();
            return Err(e);
        }
    };
    if rank == 0 {
        tracing::info!(
            "shm transport: {world} ranks, window {} KiB, FIFO depth {}, {}",
            cfg.window / 1024,
            cfg.depth,
            if cma {
                "cross-memory attach (single copy into user buffers)"
            } else {
                "bounce buffers (cross-memory attach unavailable or disabled)"
            }
        );
    }
    let names = if cfg.names.is_empty() {
        (0..world).collect()
    } else {
        cfg.names.clone()
    };
    Ok(Arc::new(ShmDevice::new(
        rank,
        layout,
        (pids, names),
        segs,
        cma,
    )))
}
