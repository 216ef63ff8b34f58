//! The executor registry: algorithms by stable name (HCCL's `REGISTER_EXEC`).

use std::collections::BTreeMap;
use std::sync::Arc;

use ampccl_runtime::{Error, Result};

use crate::algorithms;
use crate::executor::Executor;
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
    entries: BTreeMap<&'static str, Entry>,
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
        if self.entries.contains_key(name) {
            return Err(Error::InvalidUsage(format!(
                "algorithm {name:?} is already registered"
            )));
        }
        self.entries.insert(
            name,
            Entry {
                name,
                kind,
                executor,
            },
        );
        Ok(())
    }

    /// The algorithm called `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Every algorithm, sorted by name.
    pub fn list(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
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
