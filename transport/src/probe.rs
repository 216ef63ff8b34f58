//! The ordered provider probe list (NCCL style: the first provider that can connect wins).
//!
//! Shared memory connects ranks of one host; the network providers connect any ranks: `ofi`
//! (libfabric's RMA) when `AMPCCL_OFI_PROVIDER` names a libfabric provider, or, across hosts,
//! when libfabric offers an RDMA fabric's provider (`verbs`, `efa`, ...:
//! [`crate::ofi::fabrics_from_env`]; rank 0 looks, where its host has an RDMA device unless
//! the list was set, and every rank must open it, else the communicator goes on to the next
//! provider), then TCP, ampccl's own, the default for plain Ethernet, where it is faster than
//! libfabric's socket providers (docs/PERFORMANCE.md). `AMPCCL_TRANSPORT` names the provider
//! to use (`tcp`, `ofi`, or `shm` to insist on shared memory); `AMPCCL_SHM_DISABLE=1` skips
//! shared memory, so ranks of one host talk over a network provider too (for tests and
//! comparisons).
//! A communicator uses one provider for all its pairs; ranks on several hosts take a network
//! provider.

use ampccl_runtime::{Error, Result};

use crate::bootstrap::Bootstrap;

/// A transport provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Shared memory between processes of one host.
    Shm,
    /// libfabric's RMA between any hosts.
    Ofi,
    /// TCP between any hosts.
    Tcp,
}

impl Provider {
    /// Every provider, in probe order.
    pub const ALL: [Provider; 3] = [Provider::Shm, Provider::Ofi, Provider::Tcp];

    /// Name used by `AMPCCL_TRANSPORT`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Shm => "shm",
            Provider::Ofi => "ofi",
            Provider::Tcp => "tcp",
        }
    }

    /// Whether this provider may connect the ranks of `boot` (`ofi` when asked for, by name
    /// or through `AMPCCL_OFI_PROVIDER`, or across hosts to look for a fabric: whether
    /// libfabric opens shows when it connects, [`ofi_is_auto`]). Decided alike on every rank.
    pub fn can_connect(self, boot: &Bootstrap, forced: bool) -> bool {
        let one_host = boot.host_ids().iter().all(|h| *h == boot.host_id());
        match self {
            Provider::Shm => one_host,
            Provider::Ofi => {
                forced
                    || crate::ofi::provider_from_env().is_some()
                    || (!one_host && !crate::ofi::fabrics_from_env().is_empty())
            }
            Provider::Tcp => true,
        }
    }
}

/// Whether `ofi`, once selected, only looks for a fabric (nobody asked for it by name): the
/// communicator then goes on to TCP where there is none.
pub fn ofi_is_auto(forced: Option<&str>) -> bool {
    forced.is_none() && crate::ofi::provider_from_env().is_none()
}

/// Picks the provider for `boot`: the one `forced` names (the value of `AMPCCL_TRANSPORT`),
/// else the first of the probe list that can connect every pair, shared memory left out when
/// `shm_disable`.
pub fn select(boot: &Bootstrap, forced: Option<&str>, shm_disable: bool) -> Result<Provider> {
    let candidates: Vec<Provider> = match forced {
        Some(name) => match Provider::ALL.into_iter().find(|p| p.name() == name) {
            Some(p) => vec![p],
            None => {
                return Err(Error::InvalidArgument(format!(
                    "AMPCCL_TRANSPORT={name}: unknown provider (available: {})",
                    Provider::ALL.map(|p| p.name()).join(", ")
                )));
            }
        },
        None => Provider::ALL
            .into_iter()
            .filter(|p| !(shm_disable && *p == Provider::Shm))
            .collect(),
    };
    candidates
        .into_iter()
        .find(|p| p.can_connect(boot, forced.is_some()))
        .ok_or_else(|| {
            Error::InvalidUsage(
                "AMPCCL_TRANSPORT=shm cannot connect these ranks: they span several hosts".into(),
            )
        })
}
