//! Tuned parameters: constants chosen by measurement, each overridable from the environment.
//!
//! A [`Param`] is a `static` with a name (`AMPCCL_<NAME>`), a default and an accepted range. The
//! first [`Param::get`] reads the environment once and caches the value, so a parameter costs
//! one atomic load on a hot path. A value that does not parse or lies outside the range is
//! never used: [`Param::get`] falls back to the default, and [`check`] (run when a communicator
//! is configured, see `ampccl::Config::from_env`) turns it into an error that names the
//! variable and the accepted range, so a typo fails initialization instead of silently changing
//! behaviour. Sizes accept the suffixes `K`, `M` and `G` (powers of 1024).
//!
//! `docs/TUNING.md` lists every parameter with the command that re-measures it.

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// What a parameter's number counts (for parsing suffixes and for messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes; accepts `K`, `M`, `G` suffixes.
    Bytes,
    /// A plain count.
    Count,
    /// Microseconds.
    Micros,
}

/// One tuned constant with its environment override.
#[derive(Debug)]
pub struct Param {
    /// The variable's name without the `AMPCCL_` prefix.
    pub name: &'static str,
    pub default: u64,
    pub min: u64,
    pub max: u64,
    pub unit: Unit,
    /// One line: what the value controls.
    pub what: &'static str,
    value: OnceLock<u64>,
}

impl Param {
    /// A parameter; `min <= default <= max` is checked at compile time where the `static` is
    /// defined.
    pub const fn new(
        name: &'static str,
        default: u64,
        (min, max): (u64, u64),
        unit: Unit,
        what: &'static str,
    ) -> Param {
        assert!(min <= default && default <= max);
        Param {
            name,
            default,
            min,
            max,
            unit,
            what,
            value: OnceLock::new(),
        }
    }

    /// The value: the environment's if it is valid, else the default (cached after the first
    /// call).
    #[inline]
    pub fn get(&self) -> u64 {
        *self
            .value
            .get_or_init(|| self.from_env().ok().flatten().unwrap_or(self.default))
    }

    /// [`Param::get`] as a `usize`.
    #[inline]
    pub fn bytes(&self) -> usize {
        self.get() as usize
    }

    /// The variable's full name.
    pub fn var(&self) -> String {
        format!("AMPCCL_{}", self.name)
    }

    /// The environment's value: `None` when unset, an error when it is not valid.
    pub fn from_env(&self) -> Result<Option<u64>> {
        self.parse(std::env::var(self.var()).ok().as_deref())
    }

    /// Parses `text` as this parameter's value (`None` when absent or blank).
    pub fn parse(&self, text: Option<&str>) -> Result<Option<u64>> {
        let Some(t) = text.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        let value = parse_number(t, self.unit).filter(|v| (self.min..=self.max).contains(v));
        match value {
            Some(v) => Ok(Some(v)),
            None => Err(Error::InvalidArgument(format!(
                "{}={t:?}: expected {} in [{}, {}]",
                self.var(),
                match self.unit {
                    Unit::Bytes => "a byte size (K, M, G suffixes allowed)",
                    Unit::Count => "an integer",
                    Unit::Micros => "microseconds",
                },
                self.min,
                self.max
            ))),
        }
    }
}

/// An integer with an optional binary suffix (bytes only); `None` on garbage or overflow.
fn parse_number(t: &str, unit: Unit) -> Option<u64> {
    let (digits, shift) = match (unit, t.as_bytes().last()?.to_ascii_uppercase()) {
        (Unit::Bytes, b'K') => (&t[..t.len() - 1], 10),
        (Unit::Bytes, b'M') => (&t[..t.len() - 1], 20),
        (Unit::Bytes, b'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1 << shift)
}

/// Checks the environment's value of every parameter in `params`; the first invalid one is the
/// error.
pub fn check(params: &[&Param]) -> Result<()> {
    params.iter().try_for_each(|p| p.from_env().map(drop))
}

/// The runtime's parameters.
pub fn all() -> [&'static Param; 5] {
    [
        &crate::copy::VECTOR_MIN,
        &crate::copy::STREAM_MIN,
        &crate::copy::STREAM_OUT_MIN,
        &crate::copy::TEE_BLOCK,
        &crate::copy::learner::MIN_BYTES,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    static P: Param = Param::new("TEST_P", 4096, (64, 1 << 30), Unit::Bytes, "a test size");

    #[test]
    fn parses_sizes_and_rejects_out_of_range() {
        assert_eq!(P.parse(None).unwrap(), None);
        assert_eq!(P.parse(Some("  ")).unwrap(), None);
        assert_eq!(P.parse(Some("128")).unwrap(), Some(128));
        assert_eq!(P.parse(Some("8K")).unwrap(), Some(8192));
        assert_eq!(P.parse(Some("2m")).unwrap(), Some(2 << 20));
        assert_eq!(P.parse(Some("1G")).unwrap(), Some(1 << 30));
        for bad in ["2G", "1", "-5", "1e19", "abc", "99999999999999999999G", "K"] {
            let e = P.parse(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("AMPCCL_TEST_P") && e.contains("[64, 1073741824]"),
                "{e}"
            );
        }
    }

    #[test]
    fn counts_take_no_suffix() {
        static C: Param = Param::new("TEST_C", 4, (1, 64), Unit::Count, "a test count");
        assert_eq!(C.parse(Some("16")).unwrap(), Some(16));
        assert!(C.parse(Some("1K")).is_err());
    }

    #[test]
    fn defaults_are_in_range() {
        for p in all() {
            assert!((p.min..=p.max).contains(&p.default), "{}", p.name);
        }
    }
}
