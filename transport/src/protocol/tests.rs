//! Tests of the receiver-driven protocol against the in-memory pair device
//! ([`crate::testdev::PairDevice`]).

use super::*;
use crate::testdev::PairDevice;

/// The value of a poll that must be ready (test helper, shared with the eager tests).
pub(crate) fn ready<T>(p: Poll<T>) -> T {
    match p {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("unexpectedly pending"),
    }
}

#[test]
fn stripes_are_at_least_the_minimum_and_at_most_one_per_channel() {
    let k = 256 << 10;
    assert_eq!(stripe_count(0, 4, k), 1, "an empty transfer is one write");
    assert_eq!(stripe_count(k - 1, 4, k), 1);
    assert_eq!(
        stripe_count(2 * k - 1, 4, k),
        1,
        "two stripes would be short"
    );
    assert_eq!(stripe_count(2 * k, 4, k), 2);
    assert_eq!(stripe_count(4 << 20, 4, k), 4, "one per channel");
    assert_eq!(stripe_count(4 << 20, 1, k), 1);
    assert_eq!(stripe_count(1 << 20, 4, 1), 4, "the smallest minimum");
    assert_eq!(stripe_count(1 << 20, 4, 0), 4, "a zero minimum counts as 1");
}

#[test]
fn each_stripe_knows_its_number_from_its_offset() {
    for (len, nreqs) in [(1000, 1), (1 << 20, 2), ((1 << 20) + 3, 3), (4 << 20, 4)] {
        let stripe = stripe_len(len, nreqs | CTS_READ);
        assert_eq!(stripe, stripe_len(len, nreqs), "the read flag is no count");
        let offs: Vec<usize> = (0..len).step_by(stripe).collect();
        assert_eq!(offs.len(), nreqs as usize, "{len} bytes in {nreqs}");
        assert_eq!(
            stripe_pieces(len, nreqs),
            offs.len(),
            "{len} bytes in {nreqs}"
        );
        for (k, off) in offs.into_iter().enumerate() {
            assert_eq!(stripe_of(off as u64, len, nreqs), k);
        }
    }
}

/// The pieces a transfer takes are the stripes `transfer` posts, also where fewer stripes than
/// asked for cover it (whole cache lines) and for an empty one.
#[test]
fn pieces_count_the_stripes_posted() {
    for (len, nreqs) in [(0, 1), (1, 4), (100, 3), (64 << 10, 1), ((64 << 10) + 1, 4)] {
        let stripe = stripe_len(len, nreqs);
        let posted = (0..len).step_by(stripe).count();
        assert_eq!(stripe_pieces(len, nreqs), posted, "{len} bytes in {nreqs}");
    }
    assert_eq!(
        stripe_pieces(100, 3),
        2,
        "two cache-line stripes cover 100 bytes"
    );
}

#[test]
fn receiver_drives_the_transfer() {
    let (a, b) = PairDevice::pair(4, 4096);
    let src: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    // Sender cannot go before the clear-to-send.
    // SAFETY: src is valid.
    assert!(unsafe { try_send(&a, 1, 0, src.as_ptr(), 300, 7) }.is_pending());
    assert!(poll_recv(&b, 0, 0, 300).is_pending());
    let dst = b.window_ptr(100);
    ready(post_recv(&b, 0, 0, true, dst, 300, 7)).unwrap();
    // SAFETY: src is valid.
    ready(unsafe { try_send(&a, 1, 0, src.as_ptr(), 300, 7) }).unwrap();
    ready(poll_recv(&b, 0, 0, 300)).unwrap();
    assert_eq!(b.window(100, 300), src);
}

#[test]
fn fifo_flow_control_and_wraparound() {
    let (a, b) = PairDevice::pair(4, 4096);
    let t = SlotTracker::new(4);
    let mut completed = 0u32;
    for seq in 0..20u32 {
        let dst = b.window_ptr((seq as usize % 4) * 8);
        if seq >= 4 {
            // The slot of receive seq - 4 is still in use until that receive completes.
            assert!(post_recv(&b, 0, seq, t.is_free(seq), dst, 8, 1).is_pending());
        }
        while seq.wrapping_sub(completed) >= 4 {
            ready(poll_recv(&b, 0, completed, 8)).unwrap();
            t.complete(completed);
            completed += 1;
        }
        ready(post_recv(&b, 0, seq, t.is_free(seq), dst, 8, 1)).unwrap();
        let data = [seq as u8; 8];
        // SAFETY: data is valid.
        ready(unsafe { try_send(&a, 1, seq, data.as_ptr(), 8, 1) }).unwrap();
    }
    while completed < 20 {
        ready(poll_recv(&b, 0, completed, 8)).unwrap();
        completed += 1;
    }
    assert_eq!(b.window(3 * 8, 8), vec![19u8; 8]);
}

#[test]
fn slots_free_exactly_when_their_predecessor_completed() {
    let t = SlotTracker::new(4);
    assert!((0..4).all(|s| t.is_free(s)));
    assert!(!t.is_free(4) && !t.is_done(0));
    // Out of order: 3 completes first; slot 3 frees for 7, slot 0 stays taken.
    t.complete(3);
    assert!(t.is_done(3) && !t.is_done(0));
    assert!(t.is_free(7) && !t.is_free(4));
    t.complete(0);
    assert!(t.is_free(4));
    // A late record of an older operation does not move a slot back.
    t.complete(4);
    t.complete(0);
    assert!(t.is_done(4) && t.is_free(8));
    // Wrapping sequence numbers.
    let w = SlotTracker::new(4);
    for seq in (u32::MAX - 5)..=u32::MAX {
        w.complete(seq);
    }
    assert!(w.is_free(u32::MAX.wrapping_add(4)));
}

#[test]
fn reader_pulls_an_offer() {
    let (a, b) = PairDevice::pair(4, 4096);
    let src = b.window_ptr(64);
    for i in 0..200 {
        // SAFETY: inside b's window; nothing else touches it.
        unsafe { *src.add(i) = i as u8 ^ 0x5a };
    }
    let mut got = vec![0u8; 200];
    // The reader cannot go before the offer, nor the offer complete before the read.
    // SAFETY: `got` is valid for 200 writes.
    assert!(unsafe { try_read(&a, 1, 0, got.as_mut_ptr(), 200, CopyTo::Output, 3) }.is_pending());
    ready(post_offer(&b, 0, 0, true, src, 200, 3)).unwrap();
    assert!(poll_recv(&b, 0, 0, 200).is_pending());
    // SAFETY: as above.
    ready(unsafe { try_read(&a, 1, 0, got.as_mut_ptr(), 200, CopyTo::Output, 3) }).unwrap();
    ready(poll_recv(&b, 0, 0, 200)).unwrap();
    assert_eq!(got, b.window(64, 200));
}

#[test]
fn a_write_meeting_an_offer_or_a_read_meeting_a_receive_fails_both_sides() {
    let (a, b) = PairDevice::pair(4, 4096);
    let data = [7u8; 16];
    let mut buf = [0u8; 16];
    // A send finds an offer: refused, so the offered (read-only) buffer is never written.
    ready(post_offer(&b, 0, 0, true, b.window_ptr(0), 16, 1)).unwrap();
    // SAFETY: data is valid.
    let e = ready(unsafe { try_send(&a, 1, 0, data.as_ptr(), 16, 1) }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("offers its buffer")),
        "{e}"
    );
    assert!(matches!(
        ready(poll_recv(&b, 0, 0, 16)).unwrap_err(),
        Error::Remote(_)
    ));
    assert_eq!(b.window(0, 16), vec![0u8; 16]);
    // A read finds a plain clear-to-send.
    ready(post_recv(&b, 0, 1, true, b.window_ptr(0), 16, 1)).unwrap();
    // SAFETY: buf is valid.
    let e =
        ready(unsafe { try_read(&a, 1, 1, buf.as_mut_ptr(), 16, CopyTo::Output, 1) }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("expects a write")),
        "{e}"
    );
    assert!(ready(poll_recv(&b, 0, 1, 16)).is_err());
    // A read of another size than offered.
    ready(post_offer(&b, 0, 2, true, b.window_ptr(0), 16, 1)).unwrap();
    // SAFETY: buf is valid.
    let e =
        ready(unsafe { try_read(&a, 1, 2, buf.as_mut_ptr(), 8, CopyTo::Output, 1) }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("offers 16")),
        "{e}"
    );
    assert!(ready(poll_recv(&b, 0, 2, 16)).is_err());
}

#[test]
fn tag_or_size_mismatch_fails_both_sides() {
    let (a, b) = PairDevice::pair(4, 4096);
    let dst = b.window_ptr(0);
    ready(post_recv(&b, 0, 0, true, dst, 16, 1)).unwrap();
    let data = [0u8; 16];
    // SAFETY: data is valid.
    let e = ready(unsafe { try_send(&a, 1, 0, data.as_ptr(), 16, 2) }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("mismatch")),
        "{e}"
    );
    let e = ready(poll_recv(&b, 0, 0, 16)).unwrap_err();
    assert!(matches!(e, Error::Remote(_)), "{e}");

    ready(post_recv(&b, 0, 1, true, dst, 16, 1)).unwrap();
    // SAFETY: data is valid.
    let e = ready(unsafe { try_send(&a, 1, 1, data.as_ptr(), 8, 1) }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("expects 16")),
        "{e}"
    );
}

#[test]
fn zero_length_messages_match_and_mismatch() {
    let (a, b) = PairDevice::pair(4, 64);
    // An empty receive buffer may be null (an empty user slice) and outside any window.
    ready(post_recv(&b, 0, 0, true, std::ptr::null_mut(), 0, 1)).unwrap();
    // SAFETY: zero bytes are read.
    ready(unsafe { try_send(&a, 1, 0, std::ptr::null(), 0, 1) }).unwrap();
    ready(poll_recv(&b, 0, 0, 0)).unwrap();
    // 0 bytes against a receive of 8: the sender refuses, the receiver learns it.
    let dst = b.window_ptr(0);
    ready(post_recv(&b, 0, 1, true, dst, 8, 1)).unwrap();
    // SAFETY: zero bytes are read.
    let e = ready(unsafe { try_send(&a, 1, 1, std::ptr::null(), 0, 1) }).unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(ready(poll_recv(&b, 0, 1, 8)).is_err());
}

#[test]
fn unregistered_receive_buffer_is_refused() {
    let (_a, b) = PairDevice::pair(4, 64);
    let mut private = [0u8; 8];
    let e = ready(post_recv(&b, 0, 0, true, private.as_mut_ptr(), 8, 1)).unwrap_err();
    assert!(matches!(e, Error::Internal(_)));
}

/// A clear-to-send asking for more stripes than any receiver does (one per channel, at most
/// [`MAX_STRIPES`]) fails the sender with a clear error before any write, and the receiver
/// learns of it through the error immediate; one naming an address at the top of the range
/// fails too, at the device's bounds check, without overflowing on the way.
#[test]
fn hostile_stripe_counts_and_addresses_are_refused() {
    let (a, b) = PairDevice::pair(4, 4096);
    let src = [1u8; 256];
    let entry = |nreqs, addr, idx| CtsEntry {
        addr,
        size: 256,
        key: 1,
        nreqs,
        tag: 7,
        idx,
    };
    b.post_cts(0, 0, &entry(MAX_STRIPES + 1, 0, idx_of(0)))
        .unwrap();
    // SAFETY: src is valid for 256 bytes.
    let e = ready(unsafe { try_send(&a, 1, 0, src.as_ptr(), 256, 7) }).unwrap_err();
    assert!(e.to_string().contains("stripes"), "{e}");
    assert!(
        ready(poll_recv(&b, 0, 0, 256)).is_err(),
        "the receiver learns it"
    );
    b.post_cts(0, 1, &entry(4, u64::MAX - 100, idx_of(1)))
        .unwrap();
    // SAFETY: as above.
    let r = ready(unsafe { try_send(&a, 1, 1, src.as_ptr(), 256, 7) });
    assert!(r.is_err(), "an address past the end of memory is no region");
}
