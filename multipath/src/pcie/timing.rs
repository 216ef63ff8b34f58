//! Timing of calls without adding any synchronisation: timing events around NCCL's part (on the
//! user's stream) and, for split calls, around the PCIe part (on the side streams),
//! kept in a ring and read lazily — a later call, or a report, collects the calls whose events
//! have completed ([`CudaEvent::query`] never blocks). A call that finds its ring slot still
//! pending simply goes untimed.

use ampccl_runtime::cuda::{CudaEvent, StreamRef};

use crate::Result;

/// Calls whose timing can be pending at once.
const RING: usize = 32;

/// The measured times of one call (split, or on NCCL alone).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallTiming {
    /// The caller's tag (e.g. an op key and call number).
    pub tag: u64,
    /// NCCL's part, milliseconds.
    pub fast_ms: f32,
    /// The PCIe part, milliseconds (0 for a call on NCCL alone).
    pub pcie_ms: f32,
    /// From the earlier start to the later end, milliseconds.
    pub wall_ms: f32,
}

struct Slot {
    fast_start: CudaEvent,
    fast_end: CudaEvent,
    pcie_start: CudaEvent,
    pcie_end: CudaEvent,
    pending: Option<u64>,
    /// Whether the pending call has a PCIe part (its PCIe events are recorded).
    split: bool,
}

/// A ring of timing-event sets.
pub(super) struct TimingRing {
    slots: Vec<Slot>,
    next: usize,
}

/// A timed call in flight: the slot its events live in.
#[derive(Clone, Copy, Debug)]
pub struct Timed(usize);

impl TimingRing {
    pub(super) fn new() -> Result<TimingRing> {
        let mut slots = Vec::with_capacity(RING);
        for _ in 0..RING {
            slots.push(Slot {
                fast_start: CudaEvent::new(true)?,
                fast_end: CudaEvent::new(true)?,
                pcie_start: CudaEvent::new(true)?,
                pcie_end: CudaEvent::new(true)?,
                pending: None,
                split: false,
            });
        }
        Ok(TimingRing { slots, next: 0 })
    }

    /// Starts timing a call tagged `tag` at the current end of `user` (`split`: it will have a
    /// PCIe part); `None` if the next slot is still in flight.
    pub(super) fn begin(
        &mut self,
        user: StreamRef,
        tag: u64,
        split: bool,
        done: &mut Vec<CallTiming>,
    ) -> Option<Timed> {
        let i = self.next;
        if self.slots[i].pending.is_some() {
            self.collect(i, done);
            if self.slots[i].pending.is_some() {
                return None;
            }
        }
        user.record(&self.slots[i].fast_start).ok()?;
        self.slots[i].pending = Some(tag);
        self.slots[i].split = split;
        self.next = (i + 1) % RING;
        Some(Timed(i))
    }

    pub(super) fn pcie_start(&self, t: Timed, side: StreamRef) -> Result<()> {
        side.record(&self.slots[t.0].pcie_start)
    }

    pub(super) fn pcie_end(&self, t: Timed, side: StreamRef) -> Result<()> {
        side.record(&self.slots[t.0].pcie_end)
    }

    pub(super) fn fast_end(&self, t: Timed, user: StreamRef) -> Result<()> {
        user.record(&self.slots[t.0].fast_end)
    }

    /// Moves every completed call's timing to `done`.
    pub(super) fn poll(&mut self, done: &mut Vec<CallTiming>) {
        for i in 0..RING {
            self.collect(i, done);
        }
    }

    fn collect(&mut self, i: usize, done: &mut Vec<CallTiming>) {
        let s = &mut self.slots[i];
        let Some(tag) = s.pending else { return };
        let complete = |e: &CudaEvent| e.query().unwrap_or(true);
        if !(complete(&s.fast_end) && (!s.split || complete(&s.pcie_end))) {
            return;
        }
        s.pending = None;
        let ms = |a: &CudaEvent, b: &CudaEvent| CudaEvent::elapsed_ms(a, b).ok();
        if !s.split {
            if let Some(fast) = ms(&s.fast_start, &s.fast_end) {
                done.push(CallTiming {
                    tag,
                    fast_ms: fast,
                    pcie_ms: 0.0,
                    wall_ms: fast,
                });
            }
            return;
        }
        let (Some(fast), Some(pcie), Some(to_pcie_end)) = (
            ms(&s.fast_start, &s.fast_end),
            ms(&s.pcie_start, &s.pcie_end),
            ms(&s.fast_start, &s.pcie_end),
        ) else {
            return; // an event was never recorded (the call failed half-way): no timing
        };
        done.push(CallTiming {
            tag,
            fast_ms: fast,
            pcie_ms: pcie,
            wall_ms: fast.max(to_pcie_end),
        });
    }
}
