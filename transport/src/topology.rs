//! Which ranks share a host: built at init from every rank's host identity (exchanged by the
//! bootstrap: hostname and kernel boot id, or `AMPCCL_HOSTID` where set, like NCCL's
//! `NCCL_HOSTID`), and offered to operators and executors so that an algorithm can treat
//! ranks of one host (shared memory) apart from ranks across the network.
//!
//! Hosts are numbered in the order of their lowest rank; a host's ranks are listed in rank
//! order, and a rank's local rank is its place in that list.

/// The hosts of a communicator and the ranks on each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    rank: usize,
    /// Host index of each rank.
    host_of: Vec<usize>,
    /// Ranks of each host, in rank order.
    hosts: Vec<Vec<usize>>,
}

impl Topology {
    /// The topology of ranks whose host identities are `host_ids` (indexed by rank), seen by
    /// `rank`.
    pub fn new(host_ids: &[u64], rank: usize) -> Topology {
        let mut ids: Vec<u64> = Vec::new();
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let host_of = host_ids
            .iter()
            .enumerate()
            .map(|(r, id)| {
                let h = ids.iter().position(|x| x == id).unwrap_or_else(|| {
                    ids.push(*id);
                    hosts.push(Vec::new());
                    ids.len() - 1
                });
                hosts[h].push(r);
                h
            })
            .collect();
        Topology {
            rank,
            host_of,
            hosts,
        }
    }

    /// All ranks on one host (a single-host communicator of `world` ranks).
    pub fn single_host(world: usize, rank: usize) -> Topology {
        Topology::new(&vec![0; world], rank)
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The host of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    /// The ranks on `host`, in rank order.
    pub fn ranks_on(&self, host: usize) -> &[usize] {
        &self.hosts[host]
    }

    /// The ranks on this rank's host (this rank included).
    pub fn local_ranks(&self) -> &[usize] {
        self.ranks_on(self.host_of(self.rank))
    }

    /// This rank's place among the ranks of its host.
    pub fn local_rank(&self) -> usize {
        let local = self.local_ranks();
        local.iter().position(|&r| r == self.rank).unwrap_or(0)
    }

    /// The ranks per host when every host has the same number, else `None`.
    pub fn ranks_per_host(&self) -> Option<usize> {
        let n = self.hosts.first().map_or(0, Vec::len);
        self.hosts.iter().all(|h| h.len() == n).then_some(n)
    }

    /// Whether `peer` is on this rank's host.
    pub fn is_local(&self, peer: usize) -> bool {
        self.host_of(peer) == self.host_of(self.rank)
    }

    /// One line for logs: "4 ranks on 2 hosts (2, 2)".
    pub fn summary(&self) -> String {
        let sizes: Vec<String> = self.hosts.iter().map(|h| h.len().to_string()).collect();
        format!(
            "{} ranks on {} host{} ({})",
            self.host_of.len(),
            self.hosts.len(),
            if self.hosts.len() == 1 { "" } else { "s" },
            sizes.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_numbered_by_their_lowest_rank() {
        let t = Topology::new(&[7, 3, 7, 3, 9], 2);
        assert_eq!(t.hosts(), 3);
        assert_eq!(
            (0..5).map(|r| t.host_of(r)).collect::<Vec<_>>(),
            [0, 1, 0, 1, 2]
        );
        assert_eq!(t.ranks_on(1), [1, 3]);
        assert_eq!((t.local_ranks(), t.local_rank()), (&[0, 2][..], 1));
        assert!(t.is_local(0) && !t.is_local(1));
        assert_eq!(t.ranks_per_host(), None);
        assert_eq!(t.summary(), "5 ranks on 3 hosts (2, 2, 1)");
        let even = Topology::new(&[1, 1, 2, 2], 3);
        assert_eq!((even.ranks_per_host(), even.local_rank()), (Some(2), 1));
        let one = Topology::single_host(3, 0);
        assert_eq!(
            (one.hosts(), one.summary()),
            (1, "3 ranks on 1 host (3)".into())
        );
    }
}
