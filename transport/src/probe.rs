//! The ordered provider probe list (NCCL style: the first provider that can connect wins).
//!
//! `AMPCCL_TRANSPORT` names one provider and skips the rest. This build has the shared-memory
//! provider only; the list is where TCP and RDMA verbs plug in.

use ampccl_runtime::{Error, Result};

use crate::bootstrap::Bootstrap;

/// A transport provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Shared memory between processes of one host.
    Shm,
}

impl Provider {
    /// Every provider, in probe order.
    pub const ALL: [Provider; 1] = [Provider::Shm];

    /// Name used by `AMPCCL_TRANSPORT`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Shm => "shm",
        }
    }

    /// Whether this provider can connect the ranks of `boot`.
    pub fn can_connect(self, boot: &Bootstrap) -> bool {
        match self {
            Provider::Shm => boot.host_ids().iter().all(|h| *h == boot.host_id()),
        }
    }
}

/// Picks the provider for `boot`, honouring `forced` (the value of `AMPCCL_TRANSPORT`).
pub fn select(boot: &Bootstrap, forced: Option<&str>) -> Result<Provider> {
    let candidates: Vec<Provider> = match forced {
        Some(name) => match Provider::ALL.into_iter().find(|p| p.name() == name) {
            Some(p) => vec![p],
            None => {
                return Err(Error::InvalidArgument(format!(
                    "AMPCCL_TRANSPORT={name}: unknown or not built (available: {})",
                    Provider::ALL.map(|p| p.name()).join(", ")
                )));
            }
        },
        None => Provider::ALL.to_vec(),
    };
    candidates
        .into_iter()
        .find(|p| p.can_connect(boot))
        .ok_or_else(|| {
            Error::InvalidUsage(
                "no transport can connect these ranks: they span several hosts and this build has \
             only the shared-memory provider"
                    .into(),
            )
        })
}
