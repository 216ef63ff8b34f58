//! The control messages the `ofi` provider sends as two-sided messages (`fi_send` into the
//! peer's pre-posted receives), and the 32-bit remote completion data of its data writes.
//!
//! A message is a 32-byte header (kind, slot, two words, one 64-bit value, the sender's rank,
//! all little-endian) followed by the payload of a clear-to-send entry, an eager message or a
//! failure text; or, where an eager payload fits the provider's message limit only alone, the
//! payload with its header in the completion data ([`Compact`]). Messages land in receives
//! posted for any sender (not every provider matches directed receives right: libfabric 2.x's
//! `tcp` delivered one peer's messages into the receives of another from 3 ranks on), so the
//! header names the sender.
//! Decoding validates everything a peer controls (kind, slot against the FIFO depth, payload
//! length against the kind and against what arrived) and names what is wrong; the device turns
//! that into a connection error naming the peer.

use crate::device::CtsEntry;

/// Header bytes of every message.
pub const HEADER: usize = 32;
/// Where the sender's rank sits in the header.
const FROM_AT: usize = 24;
/// Bytes of an encoded clear-to-send entry.
pub const CTS_BYTES: usize = 32;
/// Flag of a [`Kind::Cts`] message: the transfer's data writes complete it by themselves, so
/// its sender sends no immediate (unless the transfer fails).
pub const CTS_WRITES_COMPLETE: u32 = 1;
/// Longest failure text a message carries.
pub const MAX_TEXT: usize = 1024;
/// Bytes of messages deferred to one peer (with their length prefixes in the batch) after
/// which they leave without waiting for a carrier (as the TCP provider's).
pub const DEFER_MAX: usize = 1024;

/// Longest message for eager payloads of at most `eager_max` bytes, and the size of every
/// receive: a batch of at most [`DEFER_MAX`] bytes of deferred messages plus one more message
/// of any kind, so that deferred messages always ride in the same message as their carrier
/// (a second message costs a second packet through the network stack, as much as the first).
pub fn msg_max(eager_max: usize) -> usize {
    HEADER + DEFER_MAX + 4 + HEADER + eager_max.max(MAX_TEXT)
}

/// Largest eager payload: one message instead of a clear-to-send, a write and an immediate,
/// for one copy more on each side (into the message, out of the receive buffer); every posted
/// receive holds one such message. docs/TUNING.md ("Fixed constants") has the measurement.
const EAGER_MAX: usize = 32 << 10;

/// `ofi_rxm`'s bounce buffer, its eager limit: libfabric's `FI_OFI_RXM_BUFFER_SIZE`, 16 KiB
/// unless set (libfabric 1.x reports it nowhere else: `ofi_rxm`'s inject size is its core
/// provider's).
fn rxm_buffer() -> usize {
    std::env::var("FI_OFI_RXM_BUFFER_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(16 << 10)
}

/// What one message carries over a provider: eager payloads of up to `eager_max` bytes, and
/// messages of up to `msg_limit` bytes in one piece (beyond it `ofi_rxm` runs a rendezvous
/// of its own under ours). Rank 0's limits hold for every rank (`connect`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub eager_max: usize,
    pub msg_limit: usize,
}

/// The [`Limits`] over `provider` (a name as libfabric gives it, `tcp;ofi_rxm`) whose remote
/// completion data holds `cq_data` bytes.
pub fn limits(provider: &str, cq_data: usize) -> Limits {
    limits_within(provider, cq_data, rxm_buffer())
}

/// [`limits`] with `ofi_rxm`'s bounce buffers of `rxm_buffer` bytes. Where `ofi_rxm` carries
/// the messages, each must fit its bounce buffer: eager payloads are as large as the buffer
/// (in whole KiB), and one that does not fit it with its header goes as a [`Compact`]
/// message, the payload alone with its header in the 64-bit completion data; where that data
/// is shorter, every eager message fits the buffer with its header and a full batch of
/// held-back messages (14 KiB of a 16 KiB buffer). Other providers carry [`msg_max`] whole.
fn limits_within(provider: &str, cq_data: usize, rxm_buffer: usize) -> Limits {
    if !provider.split(';').any(|p| p == "ofi_rxm") {
        return Limits {
            eager_max: EAGER_MAX,
            msg_limit: msg_max(EAGER_MAX),
        };
    }
    let room = if cq_data >= Compact::BYTES {
        rxm_buffer
    } else {
        rxm_buffer.saturating_sub(msg_max(0) - MAX_TEXT)
    };
    Limits {
        eager_max: (room & !1023).clamp(1 << 10, EAGER_MAX),
        // A smaller buffer (`FI_OFI_RXM_BUFFER_SIZE` set below it) still carries every
        // message, larger ones by `ofi_rxm`'s own rendezvous.
        msg_limit: rxm_buffer.max(1 << 10),
    }
}

/// An eager message whose header travels in the 64 bits of remote completion data
/// (`fi_senddata`) and whose message is the payload alone: so a payload that fits the
/// provider's message limit only without our header ([`Limits`]: a 16 KiB payload over
/// `ofi_rxm`'s 16 KiB buffer) still goes in one message. The data holds the tag, the slot
/// and the sender (ranks and slots below 2^16, as `connect` requires); the message's index
/// is the slot's next, as a sender writes into a slot only once its receiver freed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compact {
    pub tag: u32,
    pub slot: u32,
    pub from: u32,
}

impl Compact {
    /// Bytes of completion data a compact message needs.
    pub const BYTES: usize = 8;

    /// The completion data: the tag, then the slot and the sender in 16 bits each.
    pub fn encode(self) -> u64 {
        (u64::from(self.tag) << 32)
            | (u64::from(self.slot & 0xffff) << 16)
            | u64::from(self.from & 0xffff)
    }

    /// The compact header in `data` (what a peer sent: [`Compact::check`] it).
    pub fn decode(data: u64) -> Compact {
        Compact {
            tag: (data >> 32) as u32,
            slot: (data >> 16) as u32 & 0xffff,
            from: data as u32 & 0xffff,
        }
    }

    /// What is wrong with it for a FIFO of `depth` slots.
    pub fn check(&self, depth: usize) -> Result<(), String> {
        if self.slot as usize >= depth {
            return Err(format!(
                "a compact eager message for slot {} (slots: {depth})",
                self.slot
            ));
        }
        Ok(())
    }
}

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A clear-to-send entry for FIFO slot `slot`; `value` is the memory key of its region,
    /// `a` its flags ([`CTS_WRITES_COMPLETE`]).
    Cts = 1,
    /// A transfer's immediate for completion slot `slot`: `a` the immediate, `b` the number
    /// of data writes it completes, `value` the byte count.
    Imm = 2,
    /// An eager message for slot `slot`: `a` its index, `b` its tag, payload `value` bytes.
    Eager = 3,
    /// Credit word `slot` becomes `a`.
    Credit = 4,
    /// One more ack.
    Ack = 5,
    /// The sender failed; the payload says why.
    Fail = 6,
    /// Liveness only: a send that fails tells that the peer is gone.
    Ping = 7,
    /// Several messages in one: each a 4-byte length and the message ([`split_batch`]).
    Batch = 8,
}

/// A decoded message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub slot: u32,
    pub a: u32,
    pub b: u32,
    pub value: u64,
    /// The sending rank (set by [`Header::encode_into`]'s caller, checked by the receiver).
    pub from: u32,
}

impl Header {
    pub fn new(kind: Kind, slot: usize, a: u32, b: u32, value: u64) -> Header {
        Header {
            kind,
            slot: slot as u32,
            a,
            b,
            value,
            from: 0,
        }
    }

    /// The header followed by `payload`, as rank `from` sends it.
    #[cfg(test)]
    pub fn encode(&self, from: usize, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(HEADER + payload.len());
        self.encode_into(&mut m, from, payload);
        m
    }

    /// Appends the header and `payload`, as rank `from` sends them, to `out`: the header is
    /// built in place and appended once (one capacity check, not one per field).
    pub fn encode_into(&self, out: &mut Vec<u8>, from: usize, payload: &[u8]) {
        let mut h = [0u8; HEADER];
        let words = [self.kind as u32, self.slot, self.a, self.b];
        for (at, w) in h.chunks_exact_mut(4).zip(words) {
            at.copy_from_slice(&w.to_le_bytes());
        }
        h[16..24].copy_from_slice(&self.value.to_le_bytes());
        h[FROM_AT..FROM_AT + 4].copy_from_slice(&(from as u32).to_le_bytes());
        out.reserve(HEADER + payload.len());
        out.extend_from_slice(&h);
        out.extend_from_slice(payload);
    }
}

/// The rank a received message names as its sender, read even when the rest of it does not
/// decode (so that a peer sending something malformed is the one cut off); `None` when not
/// even the header arrived.
pub fn sender_of(msg: &[u8]) -> Option<u32> {
    let from: [u8; 4] = msg.get(FROM_AT..FROM_AT + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(from))
}

/// Decodes a received message of `msg.len()` bytes for a FIFO of `depth` slots whose eager
/// messages hold at most `eager_max` bytes: the header and its payload.
pub fn decode(msg: &[u8], depth: usize, eager_max: usize) -> Result<(Header, &[u8]), String> {
    if msg.len() < HEADER {
        return Err(format!(
            "a message of {} bytes (header: {HEADER})",
            msg.len()
        ));
    }
    let u32_at = |i: usize| u32::from_le_bytes(msg[i..i + 4].try_into().expect("4 bytes"));
    let kind = match u32_at(0) {
        1 => Kind::Cts,
        2 => Kind::Imm,
        3 => Kind::Eager,
        4 => Kind::Credit,
        5 => Kind::Ack,
        6 => Kind::Fail,
        7 => Kind::Ping,
        8 => Kind::Batch,
        k => return Err(format!("a message of unknown kind {k}")),
    };
    let h = Header {
        kind,
        slot: u32_at(4),
        a: u32_at(8),
        b: u32_at(12),
        value: u64::from_le_bytes(msg[16..24].try_into().expect("8 bytes")),
        from: u32_at(FROM_AT),
    };
    let payload = &msg[HEADER..];
    let slotted = matches!(kind, Kind::Cts | Kind::Imm | Kind::Eager | Kind::Credit);
    if slotted && h.slot as usize >= depth {
        return Err(format!("{kind:?} for slot {} (slots: {depth})", h.slot));
    }
    let want = match kind {
        Kind::Cts => Some(CTS_BYTES),
        Kind::Eager if h.value > eager_max as u64 => {
            return Err(format!(
                "an eager message of {} bytes (at most {eager_max})",
                h.value
            ));
        }
        Kind::Eager => Some(h.value as usize),
        Kind::Fail if payload.len() > MAX_TEXT => {
            return Err(format!("a failure text of {} bytes", payload.len()));
        }
        Kind::Fail | Kind::Batch => None,
        _ => Some(0),
    };
    if let Some(want) = want.filter(|&w| w != payload.len()) {
        return Err(format!(
            "{kind:?} with {} payload bytes (expected {want})",
            payload.len()
        ));
    }
    // No region is that large: the size would overflow the stripe arithmetic of every write
    // into it (`protocol::stripe_len`).
    if kind == Kind::Cts {
        let size = decode_cts(payload).size;
        if size > isize::MAX as u64 {
            return Err(format!("a clear-to-send of {size} bytes"));
        }
    }
    Ok((h, payload))
}

/// Bytes a message of `payload` bytes takes in a [`Kind::Batch`] payload.
pub fn batched_len(payload: usize) -> usize {
    4 + HEADER + payload
}

/// Appends the message `h` with `payload` from rank `from` to the payload of a
/// [`Kind::Batch`] message (encoded in place).
pub fn push_batch(batch: &mut Vec<u8>, h: &Header, from: usize, payload: &[u8]) {
    batch.extend_from_slice(&((HEADER + payload.len()) as u32).to_le_bytes());
    h.encode_into(batch, from, payload);
}

/// Appends to `out` a [`Kind::Batch`] message from rank `from` of the batch payload `batch`
/// followed by the message `h` with `payload`, if any.
pub fn batch_into(out: &mut Vec<u8>, from: usize, batch: &[u8], last: Option<(&Header, &[u8])>) {
    Header::new(Kind::Batch, 0, 0, 0, 0).encode_into(out, from, batch);
    if let Some((h, payload)) = last {
        push_batch(out, h, from, payload);
    }
}

/// The messages of a [`Kind::Batch`] payload, in order, each checked as it is reached (an
/// error ends the walk; batches do not nest). Walked in place: receiving a batch allocates
/// nothing.
pub fn split_batch(payload: &[u8]) -> impl Iterator<Item = Result<&[u8], String>> {
    let mut rest = Some(payload);
    std::iter::from_fn(move || {
        let payload = rest.take().filter(|p| !p.is_empty())?;
        let Some((len, tail)) = payload.split_first_chunk::<4>() else {
            return Some(Err(format!(
                "a batch ending in {} stray bytes",
                payload.len()
            )));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > tail.len() {
            return Some(Err(format!(
                "a batched message of {len} bytes, {} left",
                tail.len()
            )));
        }
        let (msg, tail) = tail.split_at(len);
        if msg.starts_with(&(Kind::Batch as u32).to_le_bytes()) {
            return Some(Err("a batch inside a batch".into()));
        }
        rest = Some(tail);
        Some(Ok(msg))
    })
}

/// A [`Kind::Cts`] message for `e` (its key is its slot): the header, with the memory key
/// `rkey` of the region it opened (0: none) and [`CTS_WRITES_COMPLETE`] where asked, and the
/// payload.
pub fn cts_message(e: &CtsEntry, writes_complete: bool, rkey: u64) -> (Header, [u8; CTS_BYTES]) {
    let flags = if writes_complete {
        CTS_WRITES_COMPLETE
    } else {
        0
    };
    let h = Header::new(Kind::Cts, e.key as usize, flags, 0, rkey);
    (h, encode_cts(e))
}

pub fn encode_cts(e: &CtsEntry) -> [u8; CTS_BYTES] {
    let mut b = [0u8; CTS_BYTES];
    b[..8].copy_from_slice(&e.addr.to_le_bytes());
    b[8..16].copy_from_slice(&e.size.to_le_bytes());
    b[16..20].copy_from_slice(&e.key.to_le_bytes());
    b[20..24].copy_from_slice(&e.nreqs.to_le_bytes());
    b[24..28].copy_from_slice(&e.tag.to_le_bytes());
    b[28..].copy_from_slice(&e.idx.to_le_bytes());
    b
}

/// The entry of a [`Kind::Cts`] payload ([`decode`] checked its length).
pub fn decode_cts(b: &[u8]) -> CtsEntry {
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    CtsEntry {
        addr: u64_at(0),
        size: u64_at(8),
        key: u32_at(16),
        nreqs: u32_at(20),
        tag: u32_at(24),
        idx: u32_at(28),
    }
}

/// Remote completion data of a data write: the writing rank and the completion slot it
/// writes for, 16 bits each (so the data fits the 4 bytes every accepted provider carries).
pub fn write_data(rank: usize, slot: usize) -> u64 {
    ((rank as u64 & 0xffff) << 16) | (slot as u64 & 0xffff)
}

/// The `(rank, slot)` of [`write_data`].
pub fn parse_write_data(data: u64) -> (usize, usize) {
    (((data >> 16) & 0xffff) as usize, (data & 0xffff) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_deferral_rides_with_the_largest_message_in_one_receive() {
        let eager_max = 4096;
        let credit = Header::new(Kind::Credit, 0, 1, 0, 0);
        let mut batch = Vec::new();
        while batch.len() + batched_len(0) <= DEFER_MAX {
            push_batch(&mut batch, &credit, 0, &[]);
        }
        let e = Header::new(Kind::Eager, 0, 1, 0, eager_max as u64);
        let payload = vec![7; eager_max];
        let eager = e.encode(0, &payload);
        let mut msg = Vec::new();
        batch_into(&mut msg, 0, &batch, Some((&e, &payload)));
        assert!(msg.len() <= msg_max(eager_max));
        let (h, payload) = decode(&msg, 1, eager_max).unwrap();
        assert_eq!(h.kind, Kind::Batch);
        let msgs: Result<Vec<_>, _> = split_batch(payload).collect();
        assert_eq!(msgs.unwrap().last(), Some(&&eager[..]));
    }

    #[test]
    fn messages_round_trip_and_bad_ones_are_named() {
        let e = CtsEntry {
            addr: 1 << 40,
            size: 77,
            key: 3,
            nreqs: 2,
            tag: 9,
            idx: 5,
        };
        let m = Header::new(Kind::Cts, 3, 0, 0, 42).encode(7, &encode_cts(&e));
        let (h, p) = decode(&m, 4, 16).unwrap();
        assert_eq!((h.kind, h.slot, h.value, h.from), (Kind::Cts, 3, 42, 7));
        assert_eq!(decode_cts(p), e);
        assert!(decode(&m, 3, 16).unwrap_err().contains("slot 3"));
        assert!(decode(&m[..HEADER + 4], 4, 16).is_err());
        let huge = CtsEntry {
            size: u64::MAX - 7,
            ..e
        };
        let m_huge = Header::new(Kind::Cts, 3, 0, 0, 42).encode(7, &encode_cts(&huge));
        assert!(
            decode(&m_huge, 4, 16)
                .unwrap_err()
                .contains("clear-to-send of")
        );
        let eager = Header::new(Kind::Eager, 0, 1, 2, 17).encode(0, &[0; 17]);
        assert!(decode(&eager, 4, 16).unwrap_err().contains("at most 16"));
        assert!(decode(&eager[..10], 4, 32).is_err());
        let mut unknown = Header::new(Kind::Ack, 0, 0, 0, 0).encode(0, &[]);
        unknown[0] = 99;
        assert!(decode(&unknown, 4, 16).unwrap_err().contains("kind 99"));
        assert_eq!(parse_write_data(write_data(513, 255)), (513, 255));
        let ack = Header::new(Kind::Ack, 0, 0, 0, 0);
        let mut batch = Vec::new();
        push_batch(&mut batch, &ack, 0, &[]);
        push_batch(
            &mut batch,
            &Header::new(Kind::Cts, 3, 0, 0, 42),
            7,
            &encode_cts(&e),
        );
        let acked = ack.encode(0, &[]);
        let msgs: Result<Vec<_>, _> = split_batch(&batch).collect();
        assert_eq!(msgs.unwrap(), vec![&acked[..], &m[..]]);
        assert!(split_batch(&batch[..batch.len() - 1]).any(|m| m.is_err()));
        let mut nested = Vec::new();
        push_batch(
            &mut nested,
            &Header::new(Kind::Batch, 0, 0, 0, 0),
            0,
            &batch,
        );
        let found: Result<Vec<_>, _> = split_batch(&nested).collect();
        assert!(found.unwrap_err().contains("inside"));
    }

    /// The sender of a message is read even when the rest is wrong (so the right peer is cut
    /// off), and not from a message shorter than a header.
    #[test]
    fn a_malformed_message_still_names_its_sender() {
        let mut m = Header::new(Kind::Credit, 0, 1, 0, 0).encode(5, &[]);
        m[0] = 99;
        assert!(decode(&m, 4, 64).is_err());
        assert_eq!(sender_of(&m), Some(5));
        assert_eq!(sender_of(&m[..27]), None);
    }

    /// Over `ofi_rxm` eager payloads are as large as its bounce buffer (default, larger and
    /// smaller ones) where the header can go as completion data, and every message fits the
    /// buffer with its header where it cannot; other providers take the full eager size.
    #[test]
    fn eager_messages_fit_the_rxm_bounce_buffer() {
        let rxm = "tcp;ofi_rxm";
        let other = limits_within("tcp", 8, 16 << 10);
        assert_eq!(other.eager_max, EAGER_MAX);
        assert!(other.msg_limit >= msg_max(EAGER_MAX));
        assert_eq!(
            limits_within("verbs;ofi_rxm", 8, 16 << 10).eager_max,
            16 << 10
        );
        assert_eq!(
            limits_within("verbs;ofi_rxm", 4, 16 << 10).eager_max,
            14 << 10
        );
        assert_eq!(
            limits_within(rxm, 8, 36 << 10).eager_max,
            EAGER_MAX,
            "capped"
        );
        assert_eq!(limits_within(rxm, 4, 0).eager_max, 1 << 10, "the floor");
        for buf in [4 << 10, 16 << 10, 20_000, 33 << 10, 36 << 10] {
            let narrow = limits_within(rxm, 4, buf);
            assert!(msg_max(narrow.eager_max) <= buf, "{buf}: {narrow:?}");
            let wide = limits_within(rxm, 8, buf);
            assert!(
                wide.eager_max <= buf && wide.eager_max >= narrow.eager_max,
                "{buf}: {wide:?}"
            );
            for l in [narrow, wide] {
                assert_eq!(l.eager_max % 1024, 0);
                assert_eq!(l.msg_limit, buf);
            }
        }
    }

    #[test]
    fn compact_headers_round_trip_and_name_bad_slots() {
        let c = Compact {
            tag: 0xdead_beef,
            slot: 255,
            from: 65535,
        };
        assert_eq!(Compact::decode(c.encode()), c);
        assert_eq!(c.check(256), Ok(()));
        let e = c.check(255).unwrap_err();
        assert!(e.contains("slot 255"), "{e}");
    }
}
