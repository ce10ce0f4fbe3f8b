//! Length-prefixed, MAC'd frames. `decode` never panics, never allocates more than the bytes
//! it was given (`decode_borrowed` allocates nothing), and verifies the MAC before it reads
//! any field other than the four that locate the MAC and its key (length, magic, version,
//! ticket nonce), all covered by the MAC. `encode_parts` and `decode_borrowed` leave the KV
//! payload where it is: on a fast link, copying it costs as much as a good part of the MAC.
//!
//! ```text
//! offset size  field
//!  0      4    len     u32 LE: bytes after this field (header rest + body + MAC)
//!  4      4    magic   "PWKV"
//!  8      2    version u16 LE (WIRE_VERSION)
//! 10      1    kind    1 = KV, 2 = close
//! 11      1    flags   0 (reserved)
//! 12     16    ticket nonce
//! 28      8    request id u64 LE
//! 36      8    tenant id  u64 LE
//! 44      4    seq     u32 LE
//! 48      ..   body    (KV: page, layer start, layer end, token start, token end, payload len:
//!                       six u32 LE, then payload; close: tokens u32, digest [32], first token u32)
//! end-32 32    MAC     keyed BLAKE3 (ticket key) over bytes 0..end-32
//! ```

use crate::error::WireError;
use crate::frame::{CloseFrame, Frame, FrameBodyRef, FrameRef, KvFrameRef, TicketId, TicketNonce, WIRE_VERSION};
use crate::mac::{verify, PromptDigest, TicketKey, TAG_LEN};
use kv::{RequestId, TenantId};
use std::collections::HashMap;

/// First bytes of every frame after the length.
pub const FRAME_MAGIC: [u8; 4] = *b"PWKV";
/// Bytes from the start of a frame to its body (length prefix included).
pub const HEADER_LEN: usize = 48;
/// Default bound on a whole frame (length prefix and MAC included): 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

const KIND_KV: u8 = 1;
const KIND_CLOSE: u8 = 2;
const KV_FIXED: usize = 24;
const CLOSE_LEN: usize = 4 + 32 + 4;

/// Finds the MAC key of a ticket named by an (untrusted) frame. Only the receiver's own
/// tickets have keys; an unknown nonce ends decoding with [`WireError::UnknownTicket`].
pub trait KeyLookup {
    fn key_for(&self, nonce: &TicketNonce) -> Option<TicketKey>;
}

impl<F: Fn(&TicketNonce) -> Option<TicketKey>> KeyLookup for F {
    fn key_for(&self, nonce: &TicketNonce) -> Option<TicketKey> {
        self(nonce)
    }
}

impl KeyLookup for HashMap<TicketNonce, TicketKey> {
    fn key_for(&self, nonce: &TicketNonce) -> Option<TicketKey> {
        self.get(nonce).cloned()
    }
}

/// Encoder and decoder with an explicit maximum frame size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    max_frame: usize,
}

impl Default for Codec {
    fn default() -> Self {
        Codec { max_frame: DEFAULT_MAX_FRAME }
    }
}

impl Codec {
    /// A codec refusing frames over `max_frame` bytes (clamped to what the u32 length can say).
    pub fn new(max_frame: usize) -> Self {
        Codec { max_frame: max_frame.min(u32::MAX as usize + 4) }
    }

    /// The largest whole frame, in bytes, this codec accepts or produces.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Total size of the frame whose first bytes are `prefix` (at least 4), checked against
    /// the maximum: what a stream reader must read before calling [`Codec::decode`].
    pub fn frame_len(&self, prefix: &[u8]) -> Result<usize, WireError> {
        let mut r = Reader::new(prefix);
        let len = r.u32()? as usize;
        let total = len.checked_add(4).ok_or(WireError::Oversized { len, max: self.max_frame })?;
        if total > self.max_frame {
            return Err(WireError::Oversized { len: total, max: self.max_frame });
        }
        Ok(total)
    }

    /// Encodes `frame` and appends its MAC under `key`.
    pub fn encode(&self, frame: &Frame, key: &TicketKey) -> Result<Vec<u8>, WireError> {
        Ok(self.encode_parts(&frame.borrowed(), key)?.to_vec())
    }

    /// [`Codec::encode`] without copying the payload: the frame's bytes are
    /// `head ‖ payload ‖ tag`, for a vectored write straight from where the payload lies.
    pub fn encode_parts<'a>(&self, frame: &FrameRef<'a>, key: &TicketKey) -> Result<EncodedFrame<'a>, WireError> {
        let (body_fixed, payload): (usize, &'a [u8]) = match &frame.body {
            FrameBodyRef::Kv(kv) => (KV_FIXED, kv.payload),
            FrameBodyRef::Close(_) => (CLOSE_LEN, &[]),
        };
        let total = (HEADER_LEN + body_fixed).saturating_add(payload.len()).saturating_add(TAG_LEN);
        if total > self.max_frame {
            return Err(WireError::Oversized { len: total, max: self.max_frame });
        }
        let len = u32::try_from(total - 4).map_err(|_| WireError::Oversized { len: total, max: self.max_frame })?;
        let mut head = Vec::with_capacity(HEADER_LEN + body_fixed);
        head.extend_from_slice(&len.to_le_bytes());
        head.extend_from_slice(&FRAME_MAGIC);
        head.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        head.push(match frame.body {
            FrameBodyRef::Kv(_) => KIND_KV,
            FrameBodyRef::Close(_) => KIND_CLOSE,
        });
        head.push(0);
        head.extend_from_slice(&frame.ticket.nonce.0);
        head.extend_from_slice(&frame.ticket.request.0.to_le_bytes());
        head.extend_from_slice(&frame.ticket.tenant.0.to_le_bytes());
        head.extend_from_slice(&frame.seq.to_le_bytes());
        match &frame.body {
            FrameBodyRef::Kv(kv) => {
                check_range("layer", kv.layers.start, kv.layers.end)?;
                check_range("token", kv.tokens.start, kv.tokens.end)?;
                let payload_len = kv.payload.len() as u32; // bounded by max_frame above
                for v in [kv.page_index, kv.layers.start, kv.layers.end, kv.tokens.start, kv.tokens.end, payload_len] {
                    head.extend_from_slice(&v.to_le_bytes());
                }
            }
            FrameBodyRef::Close(c) => {
                head.extend_from_slice(&c.tokens.to_le_bytes());
                head.extend_from_slice(&c.prompt_digest.0);
                head.extend_from_slice(&c.first_token.to_le_bytes());
            }
        }
        let tag = mac_parts(key.bytes(), &head, payload);
        Ok(EncodedFrame { head, payload, tag })
    }

    /// Decodes exactly one frame from `bytes`, verifying its MAC with the key `keys` gives for
    /// its ticket nonce before trusting any other field.
    pub fn decode(&self, bytes: &[u8], keys: &impl KeyLookup) -> Result<Frame, WireError> {
        self.decode_borrowed(bytes, keys).map(FrameRef::into_owned)
    }

    /// [`Codec::decode`] without the payload copy: the same checks in the same order, and the
    /// KV payload of the result borrows `bytes`. Allocates nothing.
    pub fn decode_borrowed<'a>(&self, bytes: &'a [u8], keys: &impl KeyLookup) -> Result<FrameRef<'a>, WireError> {
        let total = self.frame_len(bytes)?;
        if bytes.len() < total {
            return Err(WireError::Truncated { needed: total, had: bytes.len() });
        }
        if bytes.len() > total {
            return Err(WireError::TrailingBytes { extra: bytes.len() - total });
        }
        if total < HEADER_LEN + TAG_LEN {
            return Err(WireError::Truncated { needed: HEADER_LEN + TAG_LEN, had: total });
        }
        let (signed, tag) = bytes.split_at(total - TAG_LEN);
        let mut r = Reader::new(signed);
        r.take(4)?; // length, already checked
        if r.array::<4>()? != FRAME_MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = r.u16()?;
        if version != WIRE_VERSION {
            return Err(WireError::BadVersion { got: version, supported: WIRE_VERSION });
        }
        let kind = r.u8()?;
        let flags = r.u8()?;
        let nonce = TicketNonce(r.array::<16>()?);
        let key = keys.key_for(&nonce).ok_or(WireError::UnknownTicket)?;
        if !verify(key.bytes(), signed, tag) {
            return Err(WireError::BadMac);
        }
        // Authenticated from here on.
        if flags != 0 {
            return Err(WireError::Malformed("reserved flags set"));
        }
        let ticket = TicketId { nonce, request: RequestId(r.u64()?), tenant: TenantId(r.u64()?) };
        let seq = r.u32()?;
        let body = match kind {
            KIND_KV => {
                let page_index = r.u32()?;
                let layers = r.u32()?..r.u32()?;
                let tokens = r.u32()?..r.u32()?;
                let payload_len = r.u32()? as usize;
                if payload_len != r.remaining() {
                    return Err(WireError::Malformed("payload length disagrees with frame length"));
                }
                check_range("layer", layers.start, layers.end)?;
                check_range("token", tokens.start, tokens.end)?;
                let payload = r.take(payload_len)?;
                FrameBodyRef::Kv(KvFrameRef { page_index, layers, tokens, payload })
            }
            KIND_CLOSE => {
                if r.remaining() != CLOSE_LEN {
                    return Err(WireError::Malformed("closing frame body has the wrong length"));
                }
                let tokens = r.u32()?;
                let prompt_digest = PromptDigest(r.array::<32>()?);
                let first_token = r.u32()?;
                FrameBodyRef::Close(CloseFrame { tokens, prompt_digest, first_token })
            }
            _ => return Err(WireError::Malformed("unknown frame kind")),
        };
        r.finish()?;
        Ok(FrameRef { ticket, seq, body })
    }
}

/// An encoded frame in three parts, the payload borrowed: its bytes are `head ‖ payload ‖ tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedFrame<'a> {
    /// Length prefix, header and the body's fixed fields (the whole body of a close).
    pub head: Vec<u8>,
    pub payload: &'a [u8],
    pub tag: [u8; TAG_LEN],
}

impl EncodedFrame<'_> {
    /// Bytes of the whole frame.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len() + TAG_LEN
    }

    /// Never true: a frame has at least a header and a MAC.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The three parts in wire order, for a vectored write.
    pub fn parts(&self) -> [&[u8]; 3] {
        [&self.head, self.payload, &self.tag]
    }

    /// The frame as one buffer (copies the payload).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for part in self.parts() {
            out.extend_from_slice(part);
        }
        out
    }
}

/// Keyed BLAKE3 of `head ‖ payload`, equal to [`mac`] of the two concatenated.
fn mac_parts(key: &[u8; 32], head: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(head);
    h.update(payload);
    *h.finalize().as_bytes()
}

/// [`Codec::encode`] with the default maximum frame size.
pub fn encode(frame: &Frame, key: &TicketKey) -> Result<Vec<u8>, WireError> {
    Codec::default().encode(frame, key)
}

/// [`Codec::decode`] with the default maximum frame size.
pub fn decode(bytes: &[u8], keys: &impl KeyLookup) -> Result<Frame, WireError> {
    Codec::default().decode(bytes, keys)
}

fn check_range(what: &'static str, start: u32, end: u32) -> Result<(), WireError> {
    if start < end {
        Ok(())
    } else {
        Err(WireError::BadRange { what, start, end })
    }
}

/// Bounds-checked little-endian reader: every read is checked against what remains.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::Truncated { needed: n, had: self.buf.len() });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let s = self.take(N)?;
        <[u8; N]>::try_from(s).map_err(|_| WireError::Malformed("internal length"))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn finish(self) -> Result<(), WireError> {
        match self.buf.len() {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes { extra }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FrameBody, KvFrame};
    use crate::mac::mac;
    use crate::testutil::*;
    use proptest::prelude::*;

    fn enc(f: &Frame) -> Vec<u8> {
        encode(f, &key_of(&ticket())).unwrap_or_default()
    }

    /// Recomputes the MAC after a deliberate edit, to reach the checks behind it.
    fn remac(bytes: &mut [u8]) {
        let n = bytes.len() - TAG_LEN;
        let tag = mac(key_of(&ticket()).bytes(), &bytes[..n]);
        bytes[n..].copy_from_slice(&tag);
    }

    #[test]
    fn round_trip_of_every_honest_frame() {
        for f in honest_frames(&ticket()) {
            let bytes = enc(&f);
            assert_eq!(Codec::default().frame_len(&bytes), Ok(bytes.len()));
            assert_eq!(decode(&bytes, &keys()), Ok(f));
        }
    }

    #[test]
    fn parts_and_borrowed_decoding_leave_the_payload_in_place() {
        let f = kv(&ticket(), 3, 1, 0..3, 4..8);
        let FrameBody::Kv(source) = &f.body else { panic!("not a KV frame") };
        let parts = Codec::default().encode_parts(&f.borrowed(), &key_of(&ticket())).unwrap();
        assert!(std::ptr::eq(parts.payload, source.payload.as_slice()));
        assert_eq!((parts.head.len(), parts.len()), (HEADER_LEN + KV_FIXED, HEADER_LEN + KV_FIXED + 48 + TAG_LEN));
        let bytes = parts.to_vec();
        assert_eq!(bytes, enc(&f));
        let decoded = Codec::default().decode_borrowed(&bytes, &keys()).unwrap();
        let FrameBodyRef::Kv(kv) = &decoded.body else { panic!("not a KV frame") };
        assert!(std::ptr::eq(kv.payload, &bytes[HEADER_LEN + KV_FIXED..bytes.len() - TAG_LEN]));
        assert_eq!(decoded.into_owned(), f);
        let close = close(&ticket(), 6, &prompt());
        let parts = Codec::default().encode_parts(&close.borrowed(), &key_of(&ticket())).unwrap();
        assert_eq!((parts.payload.len(), parts.to_vec()), (0, enc(&close)));
    }

    #[test]
    fn flipping_any_byte_is_rejected_with_the_error_of_that_field() {
        for f in [kv(&ticket(), 0, 0, 0..2, 0..4), close(&ticket(), 6, &prompt())] {
            let bytes = enc(&f);
            for i in 0..bytes.len() {
                let mut b = bytes.clone();
                b[i] ^= 0x01;
                let err = decode(&b, &keys()).err();
                let ok = match i {
                    0..=3 => matches!(
                        err,
                        Some(
                            WireError::Truncated { .. } | WireError::TrailingBytes { .. } | WireError::Oversized { .. }
                        )
                    ),
                    4..=7 => err == Some(WireError::BadMagic),
                    8..=9 => matches!(err, Some(WireError::BadVersion { .. })),
                    12..=27 => err == Some(WireError::UnknownTicket),
                    _ => err == Some(WireError::BadMac),
                };
                assert!(ok, "byte {i}: {err:?}");
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected_as_truncated() {
        let bytes = enc(&kv(&ticket(), 0, 0, 0..3, 0..4));
        for n in 0..bytes.len() {
            assert!(matches!(decode(&bytes[..n], &keys()), Err(WireError::Truncated { .. })), "prefix {n}");
        }
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = enc(&close(&ticket(), 0, &prompt()));
        bytes.push(0);
        assert_eq!(decode(&bytes, &keys()), Err(WireError::TrailingBytes { extra: 1 }));
    }

    #[test]
    fn wrong_key_is_a_bad_mac() {
        let f = kv(&ticket(), 0, 0, 0..2, 0..4);
        let bytes = encode(&f, &TicketKey::from_bytes([0; 32])).unwrap_or_default();
        assert_eq!(decode(&bytes, &keys()), Err(WireError::BadMac));
    }

    #[test]
    fn unknown_ticket_is_rejected_before_any_parsing() {
        let bytes = enc(&kv(&ticket(), 0, 0, 0..2, 0..4));
        let none = |_: &TicketNonce| None;
        assert_eq!(decode(&bytes, &none), Err(WireError::UnknownTicket));
    }

    #[test]
    fn frame_relabelled_with_another_tickets_nonce_is_a_bad_mac() {
        let mut bytes = enc(&kv(&ticket(), 0, 0, 0..2, 0..4));
        bytes[12..28].copy_from_slice(&other_ticket().nonce.0);
        assert_eq!(decode(&bytes, &keys()), Err(WireError::BadMac));
    }

    #[test]
    fn oversized_length_is_refused_from_the_prefix_alone() {
        let codec = Codec::new(1024);
        let bytes = [0xff, 0xff, 0xff, 0x7f, b'P', b'W'];
        assert!(matches!(codec.decode(&bytes, &keys()), Err(WireError::Oversized { max: 1024, .. })));
        assert!(matches!(codec.frame_len(&bytes), Err(WireError::Oversized { .. })));
        let big = kv(&ticket(), 0, 0, 0..3, 0..4);
        assert!(matches!(Codec::new(100).encode(&big, &key_of(&ticket())), Err(WireError::Oversized { .. })));
    }

    #[test]
    fn other_version_is_refused_even_with_a_valid_mac() {
        let mut bytes = enc(&close(&ticket(), 0, &prompt()));
        bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
        remac(&mut bytes);
        assert_eq!(decode(&bytes, &keys()), Err(WireError::BadVersion { got: 2, supported: 1 }));
    }

    #[test]
    fn empty_or_inverted_ranges_are_refused_on_both_sides() {
        let mut f = kv(&ticket(), 0, 0, 0..2, 0..4);
        if let FrameBody::Kv(k) = &mut f.body {
            k.layers = 2..2;
        }
        assert!(matches!(encode(&f, &key_of(&ticket())), Err(WireError::BadRange { what: "layer", .. })));
        let mut bytes = enc(&kv(&ticket(), 0, 0, 0..2, 0..4));
        bytes[60..64].copy_from_slice(&5u32.to_le_bytes()); // token start 5 > end 4
        remac(&mut bytes);
        assert_eq!(decode(&bytes, &keys()), Err(WireError::BadRange { what: "token", start: 5, end: 4 }));
    }

    #[test]
    fn malformed_authenticated_fields_are_refused() {
        let base = enc(&kv(&ticket(), 0, 0, 0..2, 0..4));
        let cases: [(usize, &[u8]); 3] = [(10, &[9]), (11, &[1]), (68, &1u32.to_le_bytes())];
        for (at, patch) in cases {
            let mut b = base.clone();
            b[at..at + patch.len()].copy_from_slice(patch);
            remac(&mut b);
            assert!(matches!(decode(&b, &keys()), Err(WireError::Malformed(_))), "offset {at}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes, &keys());
            let _ = Codec::new(64).decode(&bytes, &keys());
        }

        #[test]
        fn arbitrary_bodies_behind_a_valid_header_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = enc(&close(&ticket(), 0, &prompt()))[..28].to_vec();
            bytes.extend_from_slice(&body);
            let len = (bytes.len() - 4) as u32;
            bytes[..4].copy_from_slice(&len.to_le_bytes());
            if bytes.len() >= HEADER_LEN + TAG_LEN { remac(&mut bytes); }
            let _ = decode(&bytes, &keys());
        }

        /// The MAC at work: whatever bytes an attacker flips, splices in or cuts out of an
        /// authentic frame, without the key it never decodes to a frame other than the original.
        #[test]
        fn mutations_of_a_valid_frame_never_decode_to_another_frame(
            close_frame in any::<bool>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
            splice in proptest::option::of((any::<prop::sample::Index>(), 0usize..40, proptest::collection::vec(any::<u8>(), 0..40))),
        ) {
            let original = if close_frame { close(&ticket(), 6, &prompt()) } else { kv(&ticket(), 0, 0, 0..3, 0..4) };
            let bytes = enc(&original);
            let mut b = bytes.clone();
            for (at, x) in flips {
                b[at.index(bytes.len())] ^= x;
            }
            if let Some((at, cut, with)) = splice {
                let at = at.index(b.len());
                let end = (at + cut).min(b.len());
                b.splice(at..end, with);
            }
            match decode(&b, &keys()) {
                Ok(f) => prop_assert!(f == original && b == bytes, "forged frame decoded: {:?}", f),
                Err(_) => prop_assert_ne!(b, bytes),
            }
        }

        #[test]
        fn borrowed_and_owned_decoding_agree_and_are_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..512), remac_it in any::<bool>()) {
            let mut bytes = bytes;
            if remac_it && bytes.len() >= HEADER_LEN + TAG_LEN {
                // A valid header for our ticket, so some inputs reach the authenticated parser.
                let head = enc(&close(&ticket(), 0, &prompt()));
                bytes[..28].copy_from_slice(&head[..28]);
                let len = (bytes.len() - 4) as u32;
                bytes[..4].copy_from_slice(&len.to_le_bytes());
                remac(&mut bytes);
            }
            let owned = decode(&bytes, &keys());
            let borrowed = Codec::default().decode_borrowed(&bytes, &keys());
            prop_assert_eq!(&owned, &borrowed.map(FrameRef::into_owned));
            if let Ok(f) = owned {
                // Canonical: one frame has one encoding, so nothing rides along unseen.
                prop_assert_eq!(enc(&f), bytes);
            }
        }

        #[test]
        fn arbitrary_kv_frames_round_trip(seq in any::<u32>(), page in any::<u32>(), l0 in 0u32..100, ln in 1u32..100,
                                          t0 in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let tokens = t0.saturating_sub(1)..t0.saturating_sub(1) + 1;
            let f = Frame::kv(ticket().id(), seq, KvFrame { page_index: page, layers: l0..l0 + ln, tokens, payload });
            prop_assert_eq!(decode(&enc(&f), &keys()), Ok(f));
        }
    }
}
