//! Logging: every ampccl crate logs through `tracing`; [`init_logging`] installs a subscriber
//! that writes to standard error, filtered by `AMPCCL_LOG` (`tracing`'s env-filter syntax,
//! default `warn`).

/// Installs the `tracing` subscriber filtered by `AMPCCL_LOG` (once per process; a subscriber
/// the application installed first wins).
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("AMPCCL_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}
