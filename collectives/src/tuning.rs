//! Tuned parameters of the whole library: constants chosen by measurement, each overridable
//! from the environment as `AMPCCL_<NAME>` ([`Param`]; docs/TUNING.md lists them with the
//! command that re-measures each).
//!
//! [`Config::from_lookup`](crate::Config::from_lookup) checks every one of them, so an invalid
//! value fails communicator initialization with a message naming the variable and its range.
//! Parameters that shape the protocol (algorithm selection, piece and chunk sizes) must have
//! the same value on every rank, as `AMPCCL_ALGO_<OP>` must.

pub use ampccl_runtime::param::{Param, Unit};

use crate::algorithms::reduce_scatter_ring;
use crate::algorithms::{allgather_pair, allreduce_oneshot, allreduce_pair, broadcast_pair};
use crate::operator::{allgather, allreduce};
use crate::steps::{pipe, window};

/// The parameters of this crate (algorithm selection, pieces, chunks, windows).
pub fn collectives_params() -> [&'static Param; 14] {
    [
        &allgather::MESH_MAX_BYTES,
        &allgather_pair::PIECE,
        &allreduce::ONE_SHOT_MAX_BYTES,
        &allreduce::ONE_SHOT_PAIR_MIN_BYTES,
        &allreduce_oneshot::ROTATE_MIN,
        &allreduce_pair::MIN_BYTES,
        &broadcast_pair::PAIR_CHUNK,
        &reduce_scatter_ring::PIECE,
        &pipe::PIPELINE_DEPTH,
        &pipe::MIN_PIPELINE_CHUNK,
        &pipe::NET_MIN_CHUNK,
        &window::SPAN,
        &crate::executor::CACHE_SHARE,
        &crate::executor::MIN_BYTES_UNKNOWN_CACHE,
    ]
}

/// Every tuned parameter: the runtime's, the transport's and this crate's.
pub fn params() -> Vec<&'static Param> {
    let mut all: Vec<&'static Param> = ampccl_runtime::param::all().to_vec();
    all.extend(ampccl_transport::params());
    all.extend(collectives_params());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_defaults_in_range() {
        let all = params();
        let mut names: Vec<&str> = all.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "a parameter name appears twice");
        for p in all {
            assert!((p.min..=p.max).contains(&p.default), "{}", p.name);
            assert_eq!(
                p.parse(Some(&p.default.to_string())).unwrap(),
                Some(p.default)
            );
        }
    }
}
