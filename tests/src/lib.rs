//! Shared helpers for the multi-process integration tests.
