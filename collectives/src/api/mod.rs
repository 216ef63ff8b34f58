//! The typed native API: blocking calls on slices ([`blocking`]), asynchronous calls on owned
//! buffers on explicit streams ([`nonblocking`]: futures for any executor), groups of
//! sends/receives, and the raw entry point of the C ABI ([`call`]).
//!
//! Buffer sizes follow NCCL's count conventions and are checked against each other; the
//! counts must also agree across ranks, which every transfer verifies (a mismatch fails the
//! operation on every rank instead of hanging).

mod blocking;
mod call;
mod nonblocking;
mod shared;

pub use blocking::Group;
pub use call::{OpSpec, RawOp, SizedOp};
pub use nonblocking::{OnStream, OpFuture, StableBuf};
pub use shared::SharedBuf;

use crate::sink::Region;

fn rd<T>(s: &[T]) -> Region {
    Region {
        ptr: s.as_ptr() as *mut u8,
        len: size_of_val(s),
    }
}

fn wr<T>(s: &mut [T]) -> Region {
    Region {
        ptr: s.as_mut_ptr().cast(),
        len: size_of_val(s),
    }
}
