//! The memory-conflict check: two accesses of one rank's memory that overlap, at least one of
//! them a write, from different tasks, with neither known complete before the other begins
//! (see [`Sim::happens_before`]) are a data race.
//!
//! This covers the usual executor slips: reusing a CCL slot before its previous contents were
//! consumed, posting a receive into memory still being read or written, modifying a send's
//! source before `tx_wait_done`, reading a receive buffer before `rx_wait_done`, or streams
//! touching the same memory without a notify between them.

use super::VerifyError;
use super::record::MEM_NAMES;
use super::sim::{Access, Sim};

/// Finds the first race (by memory position), if any.
pub(crate) fn check(sim: &Sim) -> Result<(), VerifyError> {
    let mut order: Vec<usize> = (0..sim.accesses.len())
        .filter(|&i| sim.accesses[i].end > sim.accesses[i].start)
        .collect();
    let acc = &sim.accesses;
    order.sort_by_key(|&i| (acc[i].rank, acc[i].mem, acc[i].start, i));
    // Sweep per (rank, memory), keeping the accesses that still overlap the current start.
    let mut active: Vec<usize> = Vec::new();
    let mut group = None;
    for &i in &order {
        let b = &acc[i];
        if group != Some((b.rank, b.mem)) {
            group = Some((b.rank, b.mem));
            active.clear();
        }
        active.retain(|&j| acc[j].end > b.start);
        for &j in &active {
            let a = &acc[j];
            if (a.write || b.write)
                && a.task != b.task
                && !sim.happens_before(a, b)
                && !sim.happens_before(b, a)
            {
                return Err(race(sim, a, b));
            }
        }
        active.push(i);
    }
    Ok(())
}

fn race(sim: &Sim, a: &Access, b: &Access) -> VerifyError {
    let (first, second) = if a.task.index <= b.task.index {
        (a, b)
    } else {
        (b, a)
    };
    let name = sim.ranks[a.rank]
        .as_ref()
        .map(|r| {
            if a.mem == 0 && r.layout.mem[1] == 0 {
                "User (in place)"
            } else {
                MEM_NAMES[a.mem]
            }
        })
        .unwrap_or("?");
    let elem = sim.ranks[a.rank].as_ref().map_or(1, |r| r.layout.elem);
    let lo = a.start.max(b.start) * elem;
    let hi = a.end.min(b.end) * elem;
    VerifyError::Race {
        rank: a.rank,
        mem: name,
        bytes: (lo, hi),
        first: sim.access_desc(first),
        second: sim.access_desc(second),
    }
}
