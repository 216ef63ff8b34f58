//! The ordered provider probe list (NCCL style: the first provider that can connect wins).
//!
//! Shared memory connects ranks of one host; the network provider (TCP, the only one built so
//! far) connects any ranks. `AMPCCL_TRANSPORT` names the provider to use (`tcp`, or `shm` to
//! insist on shared memory); `AMPCCL_SHM_DISABLE=1` skips shared memory, so ranks of one host
//! talk over the network provider too (for tests and comparisons). A communicator uses one
//! provider for all its pairs; ranks on several hosts take the network provider.

use ampccl_runtime::{Error, Result};

use crate::bootstrap::Bootstrap;

/// A transport provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Shared memory between processes of one host.
    Shm,
    /// TCP between any hosts.
    Tcp,
}

impl Provider {
    /// Every provider, in probe order.
    pub const ALL: [Provider; 2] = [Provider::Shm, Provider::Tcp];

    /// Name used by `AMPCCL_TRANSPORT`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Shm => "shm",
            Provider::Tcp => "tcp",
        }
    }

    /// Whether this provider can connect the ranks of `boot`.
    pub fn can_connect(self, boot: &Bootstrap) -> bool {
        match self {
            Provider::Shm => boot.host_ids().iter().all(|h| *h == boot.host_id()),
            Provider::Tcp => true,
        }
    }
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
        .find(|p| p.can_connect(boot))
        .ok_or_else(|| {
            Error::InvalidUsage(
                "AMPCCL_TRANSPORT=shm cannot connect these ranks: they span several hosts".into(),
            )
        })
}
