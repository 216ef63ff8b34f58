//! Loom models of the parameter store: the seqlock never yields a torn value, and the decision
//! ring makes racing ranks adopt one decision per call, reusing cells only after consumption.

use crate::key::{MpOp, OpKey};
use crate::param::ParamValue;
use crate::store::{Decision, Layout, ShmParamStore};
use ampccl_runtime::DataType;

const KEY: OpKey = OpKey {
    op: MpOp::AllReduce,
    bucket: 20,
    dtype: DataType::F32,
};

/// Every field derived from `x`, so a mix of two writes is visible.
fn value(x: u32) -> ParamValue {
    ParamValue {
        alpha: x as f32 / 4.0,
        use_pcie: true,
        fast_bw: x as f32,
        pcie_bw: x as f32,
        calls: x,
    }
}

#[test]
fn loom_seqlock_reader_never_sees_a_torn_value() {
    loom::model(|| {
        let mut s = ShmParamStore::in_memory(Layout {
            ring_cells: 1,
            ..Layout::new(2, 1)
        })
        .expect("store");
        let reader = s.pop().expect("rank 1");
        let writer = s.pop().expect("rank 0");
        writer.write_param(&KEY, &value(1)).expect("write");
        let t = loom::thread::spawn(move || {
            writer.write_param(&KEY, &value(2)).expect("write");
            writer.write_param(&KEY, &value(3)).expect("write");
        });
        // Busy (a write in progress past the bounded retries) is allowed, a mix is not.
        if let Ok(Some(p)) = reader.read_param(&KEY) {
            assert!([value(1), value(2), value(3)].contains(&p), "torn: {p:?}");
        }
        t.join().expect("writer");
        assert_eq!(reader.read_param(&KEY), Ok(Some(value(3))));
    });
}

fn proposal(alpha: f64, call: u64) -> Decision {
    Decision::from_param(&ParamValue::split(alpha), call as u32 + 1)
}

/// Two ranks race through calls 0 and 1 over a single ring cell, proposing different splits:
/// both use the same decision for each call. With an unbounded wait the cell is reused only
/// after both consumed call 0 (a rank reading call 0 after reuse would report a mismatch);
/// with no wait the ahead rank forces fast-only through the cell, and the other agrees.
fn ring_model(wait_rounds: u32) {
    loom::model(move || {
        let stores = ShmParamStore::in_memory(Layout {
            ring_cells: 1,
            ..Layout::new(2, 1)
        })
        .expect("store");
        let mut it = stores.into_iter().map(|s| s.with_wait_rounds(wait_rounds));
        let (a, b) = (it.next().expect("rank 0"), it.next().expect("rank 1"));
        let t = loom::thread::spawn(move || {
            (0..2u64)
                .map(|k| b.decide(k, proposal(0.5, k)).expect("rank 1 agrees"))
                .collect::<Vec<_>>()
        });
        let mine: Vec<_> = (0..2u64)
            .map(|k| a.decide(k, proposal(0.75, k)).expect("rank 0 agrees"))
            .collect();
        let theirs = t.join().expect("rank 1");
        assert_eq!(mine, theirs);
        if wait_rounds == u32::MAX {
            assert!(mine.iter().all(|d| d.use_pcie), "{mine:?}");
        }
    });
}

#[test]
fn loom_ring_agrees_and_reuses_after_consumption() {
    ring_model(u32::MAX);
}

#[test]
fn loom_ring_forced_fast_only_is_agreed() {
    ring_model(0);
}
