//! Symbolic element values of the offline verifier.
//!
//! Every element of every rank's input is a unique symbol `(rank, index)`. A value is the
//! multiset of input symbols reduced into it, plus the `n` of a final `Avg` division. The
//! common case — contributions of distinct ranks to one input index, not yet averaged — is a
//! bit mask ([`Val::Sym`], cheap to copy); everything else (mixed indices, a rank counted
//! twice, a value reduced after averaging) falls back to an explicit sorted list
//! ([`Val::Multi`]), which never equals a correct expectation but says what went wrong.

use std::fmt;
use std::sync::Arc;

/// One element's symbolic value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Val {
    /// Uninitialised memory (or anything computed from it).
    Garbage,
    /// The sum of input element `idx` of the ranks in the bit mask `ranks`, divided by `avg`
    /// when `avg != 0`.
    Sym { idx: u32, ranks: u64, avg: u32 },
    /// A general multiset of `(rank, idx)` contributions.
    Multi(Arc<Multi>),
}

/// The general form of a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Multi {
    /// `(rank, input index)` contributions, sorted, duplicates kept.
    pub parts: Vec<(u32, u32)>,
    /// Divided by this when non-zero.
    pub avg: u32,
    /// What made the value irregular beyond its parts, if anything.
    pub note: Option<&'static str>,
}

impl Val {
    /// Input element `idx` of `rank`.
    pub fn input(rank: usize, idx: usize) -> Val {
        Val::Sym {
            idx: idx as u32,
            ranks: 1 << rank,
            avg: 0,
        }
    }

    /// The expected value: input element `idx` summed over the ranks in `ranks`.
    pub fn sum(ranks: u64, idx: usize, avg: u32) -> Val {
        Val::Sym {
            idx: idx as u32,
            ranks,
            avg,
        }
    }

    fn parts(&self) -> (Vec<(u32, u32)>, u32) {
        match self {
            Val::Garbage => (Vec::new(), 0),
            Val::Sym { idx, ranks, avg } => (
                (0..64)
                    .filter(|r| ranks >> r & 1 == 1)
                    .map(|r| (r, *idx))
                    .collect(),
                *avg,
            ),
            Val::Multi(m) => (m.parts.clone(), m.avg),
        }
    }

    /// `a op b`: the union of the contributions.
    pub fn combine(&self, other: &Val) -> Val {
        match (self, other) {
            (Val::Garbage, _) | (_, Val::Garbage) => Val::Garbage,
            (
                Val::Sym {
                    idx: i,
                    ranks: r,
                    avg: 0,
                },
                Val::Sym {
                    idx: j,
                    ranks: s,
                    avg: 0,
                },
            ) if i == j && r & s == 0 => Val::Sym {
                idx: *i,
                ranks: r | s,
                avg: 0,
            },
            _ => {
                let ((mut parts, a1), (p2, a2)) = (self.parts(), other.parts());
                parts.extend(p2);
                parts.sort_unstable();
                Val::Multi(Arc::new(Multi {
                    parts,
                    avg: 0,
                    note: (a1 != 0 || a2 != 0).then_some("reduces an averaged value"),
                }))
            }
        }
    }

    /// The value divided by `n` (the end of `Avg`).
    pub fn averaged(&self, n: usize) -> Val {
        match self {
            Val::Garbage => Val::Garbage,
            Val::Sym { idx, ranks, avg: 0 } => Val::Sym {
                idx: *idx,
                ranks: *ranks,
                avg: n as u32,
            },
            Val::Multi(m) if m.avg == 0 => Val::Multi(Arc::new(Multi {
                avg: n as u32,
                ..(**m).clone()
            })),
            v => {
                let (parts, _) = v.parts();
                Val::Multi(Arc::new(Multi {
                    parts,
                    avg: n as u32,
                    note: Some("averaged twice"),
                }))
            }
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let avg = |f: &mut fmt::Formatter<'_>, a: u32| {
            if a != 0 { write!(f, " / {a}") } else { Ok(()) }
        };
        match self {
            Val::Garbage => write!(f, "garbage (uninitialised)"),
            Val::Sym { idx, ranks, avg: a } => {
                let rs: Vec<String> = (0..64)
                    .filter(|r| ranks >> r & 1 == 1)
                    .map(|r| r.to_string())
                    .collect();
                write!(f, "input[{idx}] of ranks {{{}}}", rs.join(","))?;
                avg(f, *a)
            }
            Val::Multi(m) => {
                let ps: Vec<String> = m.parts.iter().map(|(r, i)| format!("r{r}[{i}]")).collect();
                write!(f, "sum of {{{}}}", ps.join(", "))?;
                avg(f, m.avg)?;
                let mut seen = m.parts.clone();
                seen.dedup();
                if seen.len() != m.parts.len() {
                    write!(f, " (counts a contribution twice)")?;
                }
                if let Some(n) = m.note {
                    write!(f, " ({n})")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combining_and_averaging() {
        let a = Val::input(0, 3).combine(&Val::input(1, 3));
        assert_eq!(a, Val::sum(0b11, 3, 0));
        assert_eq!(a.averaged(2), Val::sum(0b11, 3, 2));
        let dup = a.combine(&Val::input(1, 3));
        assert!(matches!(dup, Val::Multi(_)));
        assert!(dup.to_string().contains("twice"), "{dup}");
        let mixed = Val::input(0, 3).combine(&Val::input(1, 4));
        assert_ne!(mixed, Val::sum(0b11, 3, 0));
        assert!(mixed.to_string().contains("r1[4]"), "{mixed}");
        assert!(a.averaged(2).averaged(2).to_string().contains("twice"));
        assert_eq!(Val::Garbage.combine(&a), Val::Garbage);
    }
}
