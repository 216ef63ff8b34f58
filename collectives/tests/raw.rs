//! The raw (C ABI) entry points: `Communicator::check_raw` refuses what `enqueue_raw` would,
//! without queueing anything, and accepts what it runs.

mod common;

use ampccl::op::OpKind;
use ampccl::{DataType, Error, OpSpec, RawOp};
use common::spawn;

#[test]
fn check_raw_agrees_with_enqueue_raw() {
    spawn(2, |c| {
        let mut buf = vec![1.0f32; 8];
        let p = buf.as_mut_ptr().cast::<u8>();
        let spec = OpSpec::new(OpKind::AllReduce, 8, DataType::F32);
        let good = RawOp {
            spec,
            send: p,
            recv: p,
        };
        c.check_raw(&good).unwrap();
        let null = RawOp {
            send: std::ptr::null(),
            ..good
        };
        assert!(matches!(c.check_raw(&null), Err(Error::InvalidArgument(m)) if m.contains("null")));
        let bad_root = RawOp {
            spec: OpSpec::new(OpKind::Broadcast, 8, DataType::F32).root(2),
            ..good
        };
        assert!(
            matches!(c.check_raw(&bad_root), Err(Error::InvalidArgument(m)) if m.contains("root 2"))
        );
        // Nothing was queued by the checks: the real operation runs and is correct.
        // SAFETY: `buf` outlives the wait below.
        let ev = unsafe { c.enqueue_raw(c.default_stream(), &[good]).unwrap() };
        ev.wait().unwrap();
        assert!(buf.iter().all(|&x| x == 2.0));
    });
}
