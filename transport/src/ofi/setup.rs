//! Connecting the `ofi` provider: which libfabric and provider, how many rails, and the
//! exchange through the bootstrap in which every rank says whether it opened the provider and
//! where its rails are ([`connect`]).

use std::sync::{Arc, OnceLock};

use ampccl_runtime::param::{Param, Unit};
use ampccl_runtime::{Error, Result};

use super::device::OfiDevice;
use super::fabric::{Caps, Endpoint, Pick, Wait};
use super::peer::PeerState;
use super::shared::Shared;
use super::state::{self, State};
use super::sys::Lib;
use super::wire;
use super::wire::{Limits, limits};
use crate::bootstrap::Bootstrap;
use crate::transport::TransportConfig;

/// Endpoints (rails) per rank (rank 0's value holds for the whole communicator); unset, see
/// [`rails_for`].
pub static RAILS: Param = Param::new(
    "OFI_RAILS",
    4,
    (1, 16),
    Unit::Count,
    "libfabric endpoints per rank (rails), each with its own connections; large writes are \
     striped over them (unset: 1 over kernel TCP connections whose congestion control does \
     not pace them, else 4)",
);

/// libfabric's core providers whose connections are the kernel's TCP sockets.
const TCP_PROVIDERS: [&str; 2] = ["tcp", "sockets"];

/// The rails rank 0 opens of `provider` when `AMPCCL_OFI_RAILS` is unset, with what decided
/// it. Over the kernel's TCP connections the host's congestion control (`congestion`, as new
/// connections get it) decides: BBR paces each connection at its estimate of the path's rate,
/// and a write striped over [`RAILS`]' default connections moved 1.3–1.6× faster than over
/// two; cubic and the other loss-based ones send as fast as the kernel copies, the copies
/// bind, and every further connection only adds acknowledgements and wake-ups to them (one
/// was the fastest from 1 to 64 MiB). Other providers (RDMA fabrics, `shm`) get the default.
pub fn rails_for(provider: &str, congestion: Option<&str>) -> (usize, String) {
    let core = provider.split_once(';').map_or(provider, |(core, _)| core);
    let default = RAILS.default as usize;
    if !TCP_PROVIDERS.contains(&core) {
        return (default, format!("the default for {provider}"));
    }
    match congestion {
        Some(cc) if !cc.starts_with("bbr") => (
            1,
            format!(
                "{provider} over TCP connections whose congestion control ({cc}) does not pace them"
            ),
        ),
        Some(cc) => (
            default,
            format!("{provider} over TCP connections paced by {cc}"),
        ),
        None => (
            default,
            format!("{provider}; the host's TCP congestion control unknown"),
        ),
    }
}

/// The TCP congestion control this host's (network namespace's) new connections get.
fn congestion_control() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The rails rank 0 opens of the provider `caps` describes: `AMPCCL_OFI_RAILS`, else
/// [`rails_for`]'s choice (logged).
fn rails_of(caps: &Caps) -> usize {
    if let Ok(Some(n)) = RAILS.from_env() {
        return n as usize;
    }
    let (n, why) = rails_for(&caps.provider, congestion_control().as_deref());
    tracing::info!("ofi: {n} rail(s): {why} (AMPCCL_OFI_RAILS overrides)");
    n
}

/// Bootstrap tags of the set-up exchanges.
const TAG_PROVIDER: u64 = 0x4f46_4900_0000_0001;
const TAG_ADDRS: u64 = 0x4f46_4900_0000_0002;
const TAG_READY: u64 = 0x4f46_4900_0000_0003;

/// The loaded libfabric, or why there is none.
pub fn library() -> std::result::Result<&'static Lib, String> {
    static LIB: OnceLock<std::result::Result<&'static Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| Lib::load().map(|l| &*Box::leak(Box::new(l))))
        .clone()
}

/// The libfabric provider `AMPCCL_OFI_PROVIDER` names (like `FI_PROVIDER`), if any.
pub fn provider_from_env() -> Option<String> {
    std::env::var("AMPCCL_OFI_PROVIDER")
        .ok()
        .filter(|s| !s.is_empty())
}

/// How this rank's idle threads wait for its completion queues: `AMPCCL_OFI_WAIT`, `fd` (the
/// default) or `poll` ([`Wait`]). Each rank follows its own value: waiting is local.
pub fn wait_from_env() -> Result<Wait> {
    parse_wait(std::env::var("AMPCCL_OFI_WAIT").ok().as_deref())
}

/// The wait mode `AMPCCL_OFI_WAIT=v` names (unset or empty: `fd`). A communicator's
/// configuration checks the variable with it too, before the bootstrap, so that a bad value
/// fails every rank alike instead of whichever rank reaches the provider first.
pub fn parse_wait(v: Option<&str>) -> Result<Wait> {
    match v.map(str::trim) {
        None | Some("" | "fd") => Ok(Wait::Fd),
        Some("poll") => Ok(Wait::Poll),
        Some(v) => Err(Error::InvalidArgument(format!(
            "AMPCCL_OFI_WAIT={v:?}: expected fd or poll"
        ))),
    }
}

/// The core providers of RDMA fabrics, which ampccl takes across hosts without being asked
/// (libfabric's socket providers lose to ampccl's own TCP provider on Ethernet).
pub const FABRICS: &str = "verbs,efa,psm3,psm2,opx,ucx,usnic";

/// The core providers `AMPCCL_OFI_FABRICS` lists (comma-separated; empty: none), else
/// [`FABRICS`].
pub fn fabrics_from_env() -> Vec<String> {
    std::env::var("AMPCCL_OFI_FABRICS")
        .unwrap_or_else(|_| FABRICS.into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Whether this host has an RDMA device that [`FABRICS`]' providers drive: an RDMA device in
/// `/sys/class/infiniband` (InfiniBand, RoCE, EFA, usNIC: `verbs`, `efa`, `psm3`, `usnic`,
/// `ucx`) or an Omni-Path `/dev/hfi1_*` (`psm2`, `opx`). Looking costs a directory read;
/// loading libfabric and asking it (`fi_getinfo` initializes every provider) costs about
/// 0.3 s, which a host without such a device is spared.
fn rdma_device_present() -> bool {
    let any = |dir: &str, prefix: &str| {
        std::fs::read_dir(dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(prefix)))
        })
    };
    any("/sys/class/infiniband", "") || any("/dev", "hfi1_")
}

/// Why rank 0 does not look for a fabric at all: the default list and no RDMA device here
/// (a list set in `AMPCCL_OFI_FABRICS` is always looked for).
fn no_fabric_here() -> Option<String> {
    (std::env::var_os("AMPCCL_OFI_FABRICS").is_none() && !rdma_device_present())
        .then(|| "no RDMA device on this host".to_string())
}

fn setup_err(what: &str) -> Error {
    Error::Remote(format!("ofi set-up: {what}"))
}

/// Connects this rank to every peer of `boot` through libfabric: rank 0 picks the provider
/// (`auto`: the first of an RDMA fabric, [`fabrics_from_env`]; else `AMPCCL_OFI_PROVIDER`, else
/// the first suitable one, leaving out `shm` when the ranks span hosts) and the number of
/// rails (`AMPCCL_OFI_RAILS`, else [`rails_for`]), every rank opens that many endpoints of
/// it, and the ranks swap their addresses. Where rank 0 finds no provider or some rank cannot
/// open it, every rank fails with the reason, or, when `auto`, returns `None` (the caller
/// takes another provider).
pub fn connect(
    boot: &Bootstrap,
    cfg: &TransportConfig,
    auto: bool,
) -> Result<Option<Arc<OfiDevice>>> {
    let (rank, world) = (boot.rank(), boot.world());
    let wait = wait_from_env()?;
    if world > 1 << 16 || cfg.fifo_depth > 1 << 16 {
        return Err(setup_err("at most 65536 ranks and FIFO slots"));
    }
    // Rank 0 opens first and tells the others which provider to open (or why none); the
    // others load libfabric only then.
    let mut ep = None;
    let chosen = if rank == 0 {
        let one_host = boot.host_ids().iter().all(|h| *h == boot.host_id());
        let opened = match (auto, no_fabric_here()) {
            (true, Some(why)) => Err(why),
            (true, None) => {
                let fabrics = fabrics_from_env();
                library().and_then(|lib| Endpoint::open(lib, Pick::Among(&fabrics), rails_of, wait))
            }
            (false, _) => open_default(library(), provider_from_env().as_deref(), one_host, wait),
        };
        let msg = match &opened {
            Ok(e) => {
                let l = limits(&e.caps.provider, e.caps.cq_data);
                let rails = e.rails();
                format!(
                    "ok\n{rails}\n{}\n{}\n{}",
                    l.eager_max, l.msg_limit, e.caps.provider
                )
            }
            Err(why) => format!("error\n{why}"),
        };
        ep = opened.ok();
        boot.broadcast(TAG_PROVIDER, 0, Some(msg.as_bytes()))?
    } else {
        boot.broadcast(TAG_PROVIDER, 0, None)?
    };
    let chosen = String::from_utf8_lossy(&chosen).into_owned();
    let (rails, limits, name) = match chosen.split_once('\n') {
        Some(("ok", rest)) => {
            let mut f = rest.splitn(4, '\n');
            let mut number = || f.next().and_then(|n| n.parse::<usize>().ok()).unwrap_or(0);
            let rails = number();
            let limits = Limits {
                eager_max: number(),
                msg_limit: number(),
            };
            (rails, limits, f.next().unwrap_or_default().to_string())
        }
        Some((_, why)) if auto => {
            if rank == 0 {
                tracing::debug!("ofi: not across these hosts: {why}");
            }
            return Ok(None);
        }
        Some((_, why)) => return Err(Error::Remote(format!("ofi: rank 0: {why}"))),
        None => return Err(setup_err("rank 0 sent no provider")),
    };
    if !(1..=RAILS.max as usize).contains(&rails) {
        return Err(setup_err("rank 0 sent no rail count"));
    }
    // Every rank's receives hold rank 0's largest message: one size for all.
    if !(1 << 10..=1 << 20).contains(&limits.eager_max) || limits.msg_limit < 1 << 10 {
        return Err(setup_err("rank 0 sent no message sizes"));
    }
    let ep = match ep {
        Some(ep) => Ok(ep),
        None => library().and_then(|lib| Endpoint::open(lib, Pick::Named(&name), |_| rails, wait)),
    };
    // Every rank tells whether it opened the provider, so that a host without the library
    // or the device fails (or, when `auto`, declines) everywhere at once: 1, its host name
    // and its rails' addresses, or 0 and why not.
    let mine = match &ep {
        Ok(ep) => {
            let mut m = vec![1];
            m.extend_from_slice(hostname().as_bytes());
            m.push(b'\n');
            for rail in 0..rails {
                let addr = ep.name(rail).map_err(|e| setup_err(&e))?;
                m.extend_from_slice(&(addr.len() as u16).to_le_bytes());
                m.extend_from_slice(&addr);
            }
            m
        }
        Err(why) => [&[0][..], why.as_bytes()].concat(),
    };
    let all = boot.allgather(TAG_ADDRS, &mine)?;
    if let Some((r, e)) = all.iter().enumerate().find(|(_, e)| e.first() != Some(&1)) {
        let why = format!(
            "rank {r} cannot open {name}: {}",
            String::from_utf8_lossy(e.get(1..).unwrap_or_default())
        );
        if auto {
            if rank == 0 {
                tracing::info!("ofi: not across these hosts: {why}");
            }
            return Ok(None);
        }
        return Err(Error::Remote(format!("ofi: {why}")));
    }
    let ep = ep.map_err(|why| Error::Remote(format!("ofi: {why}")))?;
    let mut peers = Vec::with_capacity(world);
    let mut descs = Vec::with_capacity(world);
    for (r, entry) in all.iter().map(|e| &e[1..]).enumerate() {
        let split = entry
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(entry.len());
        let host = String::from_utf8_lossy(&entry[..split]);
        let pid = boot.pids().get(r).copied().unwrap_or(0);
        descs.push(format!("rank {r} (pid {pid} on {host})"));
        if r == rank {
            peers.push(None);
            continue;
        }
        let their = split_addrs(entry.get(split + 1..).unwrap_or_default(), rails)
            .ok_or_else(|| setup_err(&format!("{}: sent malformed addresses", descs[r])))?;
        let fi_addrs = their
            .into_iter()
            .map(|a| ep.insert(a))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| setup_err(&format!("{}: {e}", descs[r])))?;
        peers.push(Some(PeerState::new(
            fi_addrs,
            descs[r].clone(),
            cfg.fifo_depth,
        )));
    }
    let caps = ep.caps.clone();
    let version = ep.version();
    let waits = !ep.wait_fds().is_empty();
    let mut state = State::new(ep, rank, peers, cfg.fifo_depth, limits);
    for _ in 0..state::recvs(world - 1) {
        let buf = vec![0u8; wire::msg_max(limits.eager_max)].into_boxed_slice();
        state
            .post_recv(buf)
            .map_err(|e| setup_err(&format!("post a receive: {e}")))?;
    }
    // Every rank's receives are posted before anyone sends.
    boot.barrier(TAG_READY)?;
    tracing::info!(
        "rank {rank}: ofi: libfabric {version}, provider {}, {rails} rail(s) ({} progress, {} \
         keys, registered memory addressed by {}{}, eager messages up to {} B, messages whole up to \
         {} B, idle threads {})",
        caps.provider,
        if caps.manual { "manual" } else { "auto" },
        if caps.prov_key {
            "provider"
        } else {
            "application"
        },
        if caps.virt_addr { "address" } else { "offset" },
        if caps.local_mr {
            ", local buffers registered"
        } else {
            ""
        },
        limits.eager_max,
        limits.msg_limit,
        if waits {
            "block on the completion queues"
        } else if wait == Wait::Poll {
            "poll the completion queues (AMPCCL_OFI_WAIT=poll)"
        } else {
            "poll the completion queues (the provider offers no wait object)"
        },
    );
    OfiDevice::start(Shared::new(
        rank,
        (cfg.fifo_depth, rails, cfg.window),
        state,
        descs,
        caps.virt_addr,
        boot.timeout(),
    )?)
    .map(Some)
}

/// Opens the endpoints rank 0 chooses: `named`, else the first suitable provider other than
/// `shm` unless every rank is on this host.
fn open_default(
    lib: std::result::Result<&'static Lib, String>,
    named: Option<&str>,
    one_host: bool,
    wait: Wait,
) -> std::result::Result<Endpoint, String> {
    let lib = lib?;
    if let Some(name) = named {
        return Endpoint::open(lib, Pick::Named(name), rails_of, wait);
    }
    let first = Endpoint::open(lib, Pick::First, rails_of, wait)?;
    if first.caps.provider != "shm" || one_host {
        return Ok(first);
    }
    drop(first);
    Endpoint::open(lib, Pick::Named("tcp;ofi_rxm"), rails_of, wait)
}

/// The `rails` addresses of a peer's entry (each a 2-byte length and the address), or `None`
/// when the entry does not hold exactly that.
fn split_addrs(mut entry: &[u8], rails: usize) -> Option<Vec<&[u8]>> {
    let mut addrs = Vec::with_capacity(rails);
    for _ in 0..rails {
        let (len, rest) = entry.split_first_chunk::<2>()?;
        let len = u16::from_le_bytes(*len) as usize;
        addrs.push(rest.get(..len)?);
        entry = &rest[len..];
    }
    entry.is_empty().then_some(addrs)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::{RAILS, rails_for, split_addrs};

    #[test]
    fn rails_follow_the_congestion_control_over_tcp_only() {
        let default = RAILS.default as usize;
        assert_eq!(rails_for("tcp", Some("cubic")).0, 1);
        assert_eq!(rails_for("tcp;ofi_rxm", Some("reno")).0, 1);
        assert_eq!(rails_for("sockets", Some("cubic")).0, 1);
        assert_eq!(rails_for("tcp", Some("bbr")).0, default);
        assert_eq!(rails_for("tcp;ofi_rxm", Some("bbr3")).0, default);
        assert_eq!(rails_for("tcp", None).0, default, "unknown: the default");
        assert_eq!(rails_for("verbs;ofi_rxm", Some("cubic")).0, default);
        assert_eq!(rails_for("efa", Some("cubic")).0, default);
        assert_eq!(rails_for("shm", Some("cubic")).0, default);
        assert!(rails_for("tcp", Some("cubic")).1.contains("cubic"));
    }

    #[test]
    fn rail_addresses_split_or_are_refused() {
        let entry = [2, 0, b'a', b'b', 1, 0, b'c'];
        assert_eq!(split_addrs(&entry, 2), Some(vec![&b"ab"[..], &b"c"[..]]));
        assert_eq!(split_addrs(&entry, 1), None, "bytes left over");
        assert_eq!(split_addrs(&entry, 3), None, "a rail missing");
        assert_eq!(split_addrs(&entry[..5], 2), None, "an address cut short");
    }
}
