//! Progress of a sweep on stderr (`[12/24] 4 MiB allreduce`), shown by rank 0 when stderr is
//! a terminal or with `--progress`; never on stdout, so tables and CSV stay clean.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use crate::cli::human_bytes;

/// Reports the size being measured.
pub struct Progress {
    /// Whether anything is shown.
    on: bool,
    /// Rewrite one line in place (terminal) instead of printing a line per size.
    tty: bool,
    total: usize,
    start: Instant,
}

impl Progress {
    /// `shown`: this rank reports at all (rank 0); `forced`: `--progress`.
    pub fn new(shown: bool, forced: bool, total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal();
        Progress {
            on: shown && (forced || tty),
            tty,
            total,
            start: Instant::now(),
        }
    }

    /// Size number `i` (from 1) of `bytes` is being measured.
    pub fn step(&self, i: usize, bytes: usize, what: &str) {
        if !self.on {
            return;
        }
        let line = format!(
            "[{i}/{}] {} {what} ({:.1} s)",
            self.total,
            human_bytes(bytes),
            self.start.elapsed().as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the sweep.
        let _ = if self.tty {
            write!(err, "\r\x1b[K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    /// Erases the in-place line before stdout prints on the same terminal.
    pub fn clear(&self) {
        if self.on && self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}
