//! Reusable orchestration steps shared by several algorithms (HCCL's third tier).

pub mod blocks;
pub mod exchange;
pub mod pipe;
pub mod ring;
pub mod window;
