//! `OpLog`: the records of the last operations this rank ran, as the network providers keep
//! them in process memory (their peers' records stay on the peers' hosts; the shared-memory
//! provider keeps its own in the segment, where local peers read them), and the formatter
//! that turns a record into the description a mismatch or timeout error quotes.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use crate::device::OpRecord;
use crate::transport::OpFormatter;

/// Records kept: enough to find the operation a peer's message belongs to.
const DEPTH: usize = 8;

#[derive(Default)]
pub struct OpLog {
    /// Oldest first.
    ops: Mutex<VecDeque<OpRecord>>,
    formatter: OnceLock<OpFormatter>,
}

impl OpLog {
    /// Appends `record`, dropping the oldest beyond [`DEPTH`] (`Transport::set_op`).
    pub fn push(&self, record: &OpRecord) {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        if ops.len() == DEPTH {
            ops.pop_front();
        }
        ops.push_back(*record);
    }

    /// Sets how records are described, once (`Transport::set_op_formatter`).
    pub fn set_formatter(&self, f: OpFormatter) {
        let _ = self.formatter.set(f);
    }

    /// This rank's records, newest first (`RmaDevice::op_history(None)`).
    pub fn newest_first(&self) -> Vec<OpRecord> {
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        ops.iter().rev().copied().collect()
    }

    /// The description of the operation with tag `tag`, else of the newest one
    /// (`RmaDevice::local_op`).
    pub fn describe(&self, tag: u32) -> Option<String> {
        let ops = self.newest_first();
        let record = ops.iter().find(|r| r[0] as u32 == tag).or(ops.first())?;
        self.formatter.get().and_then(|f| f(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn describe(r: &[u64]) -> Option<String> {
        Some(format!("op {}", r[0]))
    }

    #[test]
    fn keeps_the_newest_records_and_describes_by_tag() {
        let log = OpLog::default();
        assert_eq!(log.describe(1), None);
        for tag in 0..DEPTH as u64 + 3 {
            let mut r: OpRecord = Default::default();
            r[0] = tag;
            log.push(&r);
        }
        let ops = log.newest_first();
        assert_eq!(ops.len(), DEPTH);
        assert_eq!(ops[0][0], DEPTH as u64 + 2);
        assert_eq!(log.describe(5), None, "no formatter yet");
        log.set_formatter(describe);
        assert_eq!(log.describe(5).as_deref(), Some("op 5"));
        // An unknown tag (dropped or never run) describes the newest.
        assert_eq!(log.describe(0).as_deref(), Some("op 10"));
    }
}
