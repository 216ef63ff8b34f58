//! Which libfabric the `ofi` provider's tests run over ([`Libfabric`]), and [`over`], which
//! points a launch at it, or says why the test is skipped: without the library (or Intel MPI's
//! copy of libfabric 2.x, which `benches/peers/install.sh` installs) a test prints the reason
//! and passes, except under CI (`CI` set), where it fails.

use std::path::PathBuf;

use crate::Launch;
use crate::hosts::in_ci;

/// A libfabric and one of its providers.
#[derive(Clone, Copy, Debug)]
pub enum Libfabric {
    /// The system's library (Debian's 1.17: `tcp;ofi_rxm`, `shm`, manual progress).
    System(&'static str),
    /// The libfabric 2.x that Intel MPI's wheel bundles (its `tcp` provider has reliable
    /// datagrams of its own and progresses automatically), through `LD_LIBRARY_PATH` and
    /// `FI_PROVIDER_PATH`.
    IntelMpi(&'static str),
}

/// The directory of Intel MPI's libfabric under `PEERS_HOME` (default `~/.cache/ampccl-peers`).
fn intel_mpi_lib() -> PathBuf {
    let home = std::env::var("PEERS_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.cache/ampccl-peers",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    PathBuf::from(home).join("impi/lib")
}

/// `launch` over the `ofi` provider with `lib`, or `None` after printing why the test is
/// skipped (panics under CI instead).
pub fn over(launch: Launch, lib: Libfabric) -> Option<Launch> {
    let missing = match lib {
        Libfabric::System(_) => ampccl_transport::ofi::library().err(),
        Libfabric::IntelMpi(_) => {
            let dir = intel_mpi_lib();
            (!dir.join("libfabric.so.1").exists()).then(|| {
                format!(
                    "no Intel MPI libfabric in {} (benches/peers/install.sh)",
                    dir.display()
                )
            })
        }
    };
    if let Some(why) = missing {
        assert!(
            !in_ci(),
            "libfabric is required under CI (CI is set): {why}"
        );
        println!("skipped: {why}");
        return None;
    }
    let launch = launch.env("AMPCCL_TRANSPORT", "ofi");
    Some(match lib {
        Libfabric::System(provider) => launch.env("AMPCCL_OFI_PROVIDER", provider),
        Libfabric::IntelMpi(provider) => {
            let dir = intel_mpi_lib();
            let dir = dir.to_str().expect("a UTF-8 path");
            launch
                .env("AMPCCL_OFI_PROVIDER", provider)
                .env("LD_LIBRARY_PATH", dir)
                .env("FI_PROVIDER_PATH", dir)
        }
    })
}
