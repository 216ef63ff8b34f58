//! Shared-memory transport building blocks for processes on one host: POSIX shared-memory
//! segments ([`segment`]) and cross-memory attach ([`cma`]).

pub mod cma;
pub mod segment;
