//! Helpers shared by the thread-mode test binaries: every rank is a thread of this process
//! (gloo's `BaseTest::spawn` style), connected through the real shared-memory transport.
#![allow(dead_code)]

use std::time::Duration;

use ampccl::registry::Registry;
use ampccl::{Communicator, Config, UniqueId};

/// The test configuration: small CCL buffers (64 KiB) so chunking is exercised.
pub fn test_config() -> Config {
    Config {
        timeout: Duration::from_secs(15),
        buffsize: 64 * 1024,
        ..Config::default()
    }
}

/// Runs `f` on `world` ranks with [`test_config`].
pub fn spawn<T: Send + 'static>(
    world: usize,
    f: impl Fn(Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    spawn_with(world, test_config(), f)
}

/// Runs `f` on `world` ranks with `cfg`; results in rank order.
pub fn spawn_with<T: Send + 'static>(
    world: usize,
    cfg: Config,
    f: impl Fn(Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let id = UniqueId::generate().unwrap();
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let (f, cfg) = (f.clone(), cfg.clone());
            std::thread::spawn(move || {
                let c = Communicator::init_with(&id, r, world, cfg, Registry::builtin()).unwrap();
                f(c)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
