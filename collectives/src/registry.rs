//! The executor registry: algorithms by stable name (HCCL's `REGISTER_EXEC`).

use std::sync::Arc;

use ampccl_runtime::{Error, Result};

use crate::algorithms;
use crate::executor::Executor;
use crate::fasthash::FastMap;
use crate::op::OpKind;

/// A registered algorithm.
#[derive(Clone)]
pub struct Entry {
    pub name: &'static str,
    pub kind: OpKind,
    pub executor: Arc<dyn Executor>,
}

/// Algorithms by name. Registering a name twice is an error.
#[derive(Clone, Default)]
pub struct Registry {
    /// Sorted by name.
    entries: Vec<Entry>,
    /// Position in `entries` by name.
    index: FastMap<&'static str, usize>,
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Registry {
        Registry::default()
    }

    /// The built-in algorithms.
    pub fn builtin() -> Registry {
        let mut r = Registry::empty();
        for (name, kind, exec) in algorithms::builtin() {
            r.register(name, kind, exec)
                .expect("built-in algorithm names are unique");
        }
        r
    }

    /// Adds an algorithm for operations of `kind`.
    pub fn register(
        &mut self,
        name: &'static str,
        kind: OpKind,
        executor: Arc<dyn Executor>,
    ) -> Result<()> {
        let Err(at) = self.entries.binary_search_by_key(&name, |e| e.name) else {
            return Err(Error::InvalidUsage(format!(
                "algorithm {name:?} is already registered"
            )));
        };
        self.entries.insert(
            at,
            Entry {
                name,
                kind,
                executor,
            },
        );
        self.index = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name, i))
            .collect();
        Ok(())
    }

    /// The algorithm called `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.position(name).map(|i| &self.entries[i])
    }

    /// Where the algorithm called `name` is in [`Registry::list`]'s order.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The algorithm at `position` (see [`Registry::position`]).
    pub(crate) fn at(&self, position: usize) -> &Entry {
        &self.entries[position]
    }

    /// Every algorithm, sorted by name.
    pub fn list(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }
}

impl std::fmt::Display for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for e in self.list() {
            writeln!(f, "{:<28} {}", e.name, e.kind.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::allreduce_ring;
    use ampccl_transport::topology::Topology;

    #[test]
    fn builtins_cover_every_kind_and_duplicates_are_refused() {
        let mut r = Registry::builtin();
        for kind in OpKind::ALL {
            assert!(
                r.list().any(|e| e.kind == kind),
                "no algorithm for {}",
                kind.name()
            );
        }
        let ring = r
            .get(allreduce_ring::NAME)
            .expect("built in")
            .executor
            .clone();
        let err = r
            .register(allreduce_ring::NAME, OpKind::AllReduce, ring.clone())
            .unwrap_err();
        assert!(matches!(err, Error::InvalidUsage(ref m) if m.contains("already registered")));
        r.register("MyRing", OpKind::AllReduce, ring).unwrap();
        assert_eq!(r.get("MyRing").map(|e| e.kind), Some(OpKind::AllReduce));
        assert!(r.to_string().contains("MyRing"));
    }

    #[test]
    fn every_operator_selection_is_registered() {
        use crate::executor::SelectCtx;
        use crate::op::OpParam;
        let r = Registry::builtin();
        for kind in OpKind::ALL {
            for count in [0usize, 1, 1000, 1 << 20] {
                for world in 1..=8 {
                    let p = OpParam {
                        kind,
                        count,
                        dtype: ampccl_runtime::DataType::F32,
                        op: ampccl_runtime::ReduceOp::Sum,
                        root: 0,
                        rank: 0,
                        world,
                        in_place: false,
                        seq: 0,
                    };
                    for user_mem_links in [false, true] {
                        let topology = Topology::single_host(world, 0);
                        let ctx = SelectCtx {
                            ccl_size: 4 << 20,
                            user_mem_links,
                            oversubscribed: world > 2,
                            cache_bytes: 32 << 20,
                            topology: &topology,
                        };
                        let (name, _) = crate::operator::for_kind(kind).select_alg(&p, &ctx);
                        let e = r
                            .get(name)
                            .unwrap_or_else(|| panic!("{name} not registered"));
                        assert_eq!(e.kind, kind);
                    }
                }
            }
        }
    }
}
