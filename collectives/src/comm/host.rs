//! What the ranks of one host agree on about it at init: whether they oversubscribe its CPUs
//! and the size of its last-level cache. Every local rank computes the same facts from the
//! same gathered data, so their algorithm choices agree.

use ampccl_runtime::Result;
use ampccl_transport::bootstrap::Bootstrap;
use ampccl_transport::topology::Topology;

/// Bootstrap tag of the host facts gathered at init.
const TAG_HOST: u64 = 0x4350_5500_0000_0000;

/// What the ranks on this host agree on about it (every local rank computes the same, so
/// their algorithm choices agree).
#[derive(Clone, Copy, Debug)]
pub(super) struct HostFacts {
    /// Whether this host runs more ranks of the communicator than the CPUs they may run on
    /// together: the union of the local ranks' affinity masks. Each rank's own mask is not
    /// enough: ranks pinned one per CPU (as MPI launchers and `ampccl-perf -g` pin them) each
    /// see one CPU, yet none shares its core. See [`crate::executor::SelectCtx::oversubscribed`].
    pub(super) oversubscribed: bool,
    /// See [`crate::executor::SelectCtx::cache_bytes`].
    pub(super) cache_bytes: usize,
}

/// Gathers every rank's CPU set and last-level cache size (`cache_bytes`, else sysfs's); the
/// local ones decide.
pub(super) fn host_facts(
    boot: &Bootstrap,
    topology: &Topology,
    cache_bytes: Option<usize>,
) -> Result<HostFacts> {
    let cache = cache_bytes.unwrap_or_else(last_level_cache_bytes);
    let mut mine = (cache as u64).to_le_bytes().to_vec();
    mine.extend(cpu_mask());
    let all = boot.allgather(TAG_HOST, &mine)?;
    let local: Vec<(u64, &[u8])> = topology
        .local_ranks()
        .iter()
        .map(|&r| {
            let (cache, mask) = all[r].split_at(8.min(all[r].len()));
            (cache.try_into().map_or(0, u64::from_le_bytes), mask)
        })
        .collect();
    let masks: Vec<&[u8]> = local.iter().map(|(_, m)| *m).collect();
    Ok(HostFacts {
        oversubscribed: local.len() > cpus_in_union(&masks),
        cache_bytes: local.iter().map(|(c, _)| *c).min().unwrap_or(0) as usize,
    })
}

/// Size of the last (highest-level) cache of CPU 0, from sysfs; 0 if it cannot be read.
fn last_level_cache_bytes() -> usize {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let level: u32 = read(path.join("level"))?.trim().parse().ok()?;
            Some((level, parse_cache_size(&read(path.join("size"))?)?))
        })
        .max()
        .map_or(0, |(_, bytes)| bytes)
}

/// A sysfs cache size (`32768K`, `4M`, `512`) in bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last()? {
        (i, 'K') => (&s[..i], 1 << 10),
        (i, 'M') => (&s[..i], 1 << 20),
        (i, 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(unit)
}

/// The CPUs this thread may run on, as a bitmap (bit `c % 8` of byte `c / 8`); when the mask
/// cannot be read, as many CPUs as `available_parallelism` counts.
fn cpu_mask() -> Vec<u8> {
    use rustix::thread::{CpuSet, sched_getaffinity};
    let mut bits = vec![0u8; CpuSet::MAX_CPU.div_ceil(8)];
    match sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .for_each(|c| bits[c / 8] |= 1 << (c % 8)),
        Err(_) => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n.min(CpuSet::MAX_CPU)).for_each(|c| bits[c / 8] |= 1 << (c % 8));
        }
    }
    bits
}

/// Number of CPUs in the union of bitmaps (at least 1).
fn cpus_in_union(masks: &[&[u8]]) -> usize {
    let len = masks.iter().map(|m| m.len()).max().unwrap_or(0);
    let n: u32 = (0..len)
        .map(|i| {
            masks
                .iter()
                .fold(0u8, |acc, m| acc | m.get(i).copied().unwrap_or(0))
                .count_ones()
        })
        .sum();
    (n as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_ranks_count_the_union_of_their_cpus() {
        let (cpu0, cpu1, both) = ([0b01u8], [0b10u8], [0b11u8]);
        // Two ranks pinned to CPUs 0 and 1: two CPUs, not oversubscribed.
        assert_eq!(cpus_in_union(&[&cpu0, &cpu1]), 2);
        // Both pinned to CPU 0, or unpinned on a 2-CPU host.
        assert_eq!(cpus_in_union(&[&cpu0, &cpu0]), 1);
        assert_eq!(cpus_in_union(&[&both, &both, &both]), 2);
        // Masks of different lengths; an empty set still counts one CPU.
        assert_eq!(cpus_in_union(&[&[0u8, 0b1000_0000], &cpu1]), 2);
        assert_eq!(cpus_in_union(&[&[]]), 1);
        assert!(cpu_mask().iter().any(|b| *b != 0));
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("4M"), Some(4 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("x12K"), None);
    }
}
