//! KV frames on an encrypted link. Two AEAD seals per frame: the fixed-size header under the
//! link's key (AES-256-GCM; its nonce the link's record counter, never sent), so nothing of it (ids, ticket,
//! ranges) is readable on the network and no frame can be dropped, repeated, reordered or
//! carried over from another connection unseen; and the body (KV payload, or the close's
//! fields) under the ticket's key (AEGIS-128X2), derived on both ends from the link and the ticket, with the
//! header in clear as associated data and the frame's sequence number as nonce.
//!
//! ```text
//! offset size  field
//!  0      4    len          u32 LE: bytes after this field
//!  4     68    header       sealed under the link key; associated data: len
//! 72     16    header tag
//! 88      n    body         sealed under the ticket key (nonce: seq); associated data: the
//! 88+n   16    body tag     68 header bytes in clear
//!
//! header in clear: magic "PWKV" | version u16 | kind u8 (1 KV, 2 close) | flags u8 (0) |
//!   ticket nonce [16] | request u64 | tenant u64 | seq u32 | page u32 | layer start u32 |
//!   layer end u32 | token start u32 | token end u32 | body length u32   (all LE; a close has
//!   zero page and ranges and a 40-byte body: tokens u32, prompt digest [32], first token u32)
//! ```
//!
//! Opening never panics, allocates nothing, and authenticates every byte before it trusts
//! any field other than the length (checked against the maximum before anything is read).
//! A stream reader opens the fixed-size header first ([`KvOpener::open_header`]) and only
//! then makes room for the body: what a peer's length field makes it allocate is a length
//! the link key authenticated, for a ticket the receiver holds, never a claim.
//! The body is decrypted where it lies: the decode worker writes KV into its pages from its
//! read buffer, and the sender encrypts the payload it exported in place.

use std::collections::HashSet;
use std::ops::Range;

use crate::error::WireError;
use crate::frame::{
    CloseFrame, Frame, FrameBodyRef, FrameRef, KvFrameRef, PromptDigest, TicketId, TicketNonce, WIRE_VERSION,
};
use crate::keys::{Exporter, SessionKeys, TicketKey};
use crate::reader::Reader;
use crate::record::{RecordOpener, RecordSealer, AEAD_TAG_LEN};
use kv::{RequestId, TenantId};

/// First bytes of every frame header.
pub const FRAME_MAGIC: [u8; 4] = *b"PWKV";
/// Bytes of the header in clear.
pub const HEADER_PLAIN_LEN: usize = 68;
/// Bytes from the start of a frame to its body: length, sealed header, header tag.
pub const HEADER_LEN: usize = 4 + HEADER_PLAIN_LEN + AEAD_TAG_LEN;
/// Bytes a frame adds to its body.
pub const FRAME_OVERHEAD: usize = HEADER_LEN + AEAD_TAG_LEN;
/// Default bound on a whole frame (length prefix and tags included): 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

const KIND_KV: u8 = 1;
const KIND_CLOSE: u8 = 2;
const CLOSE_LEN: usize = 4 + 32 + 4;

/// Whether the receiver holds a ticket named by an (authenticated) frame header. Frames for
/// tickets it does not hold end with [`WireError::UnknownTicket`] before their body is opened.
pub trait TicketLookup {
    fn holds(&self, nonce: &TicketNonce) -> bool;
}

impl<F: Fn(&TicketNonce) -> bool> TicketLookup for F {
    fn holds(&self, nonce: &TicketNonce) -> bool {
        self(nonce)
    }
}

impl TicketLookup for HashSet<TicketNonce> {
    fn holds(&self, nonce: &TicketNonce) -> bool {
        self.contains(nonce)
    }
}

/// A KV frame to seal: its payload is encrypted where it lies.
#[derive(Debug)]
pub struct KvFrameMut<'a> {
    pub page_index: u32,
    pub layers: Range<u32>,
    pub tokens: Range<u32>,
    pub payload: &'a mut [u8],
}

/// The parts a sealed KV frame adds around its (now encrypted) payload: on the wire,
/// `head ‖ payload ‖ tag`, for one vectored write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedParts {
    pub head: [u8; HEADER_LEN],
    pub tag: [u8; AEAD_TAG_LEN],
}

impl SealedParts {
    /// The whole frame around `payload` (copies it).
    pub fn to_vec(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(FRAME_OVERHEAD + payload.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(payload);
        out.extend_from_slice(&self.tag);
        out
    }
}

/// A frame header that opened under the link key ([`KvOpener::open_header`]): every field
/// authentic, the body not read yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedHeader {
    plain: [u8; HEADER_PLAIN_LEN],
    kind: u8,
    ticket: TicketId,
    seq: u32,
    page_index: u32,
    layers: Range<u32>,
    tokens: Range<u32>,
    body_len: usize,
}

impl OpenedHeader {
    /// Bytes of the frame after the header: the body and its tag.
    pub fn rest_len(&self) -> usize {
        self.body_len + AEAD_TAG_LEN
    }
}

fn frame_len(max_frame: usize, prefix: &[u8]) -> Result<usize, WireError> {
    let mut r = Reader::new(prefix);
    let len = r.u32()? as usize;
    let total = len.checked_add(4).ok_or(WireError::Oversized { len, max: max_frame })?;
    if total > max_frame {
        return Err(WireError::Oversized { len: total, max: max_frame });
    }
    if total < FRAME_OVERHEAD {
        return Err(WireError::Truncated { needed: FRAME_OVERHEAD, had: total });
    }
    Ok(total)
}

fn check_range(what: &'static str, r: &Range<u32>) -> Result<(), WireError> {
    if r.start < r.end {
        Ok(())
    } else {
        Err(WireError::BadRange { what, start: r.start, end: r.end })
    }
}

/// Where a body to seal lies: encrypted where it is, or from a source into a buffer.
enum Body<'a> {
    InPlace(&'a mut [u8]),
    Copy { src: &'a [u8], dst: &'a mut [u8] },
}

impl Body<'_> {
    fn len(&self) -> usize {
        match self {
            Body::InPlace(b) => b.len(),
            Body::Copy { src, .. } => src.len(),
        }
    }
}

/// Seals the body under the ticket key (nonce: `seq`, associated data: the header in clear),
/// then the header under the link key (associated data: the length prefix).
fn seal_parts(
    link: &mut RecordSealer,
    key: &TicketKey,
    plain: &[u8; HEADER_PLAIN_LEN],
    seq: u32,
    body: Body<'_>,
) -> Result<SealedParts, WireError> {
    let body_len = body.len();
    let tag = match body {
        Body::InPlace(b) => key.seal(seq, plain, b),
        Body::Copy { src, dst } => key.seal_from(seq, plain, src, dst)?,
    };
    let len = u32::try_from(HEADER_PLAIN_LEN + 2 * AEAD_TAG_LEN + body_len)
        .map_err(|_| WireError::Oversized { len: body_len, max: u32::MAX as usize })?;
    let mut head = [0u8; HEADER_LEN];
    let (prefix, rest) = head.split_at_mut(4);
    prefix.copy_from_slice(&len.to_le_bytes());
    let (hdr, hdr_tag) = rest.split_at_mut(HEADER_PLAIN_LEN);
    hdr.copy_from_slice(plain);
    hdr_tag.copy_from_slice(&link.seal(prefix, hdr)?);
    Ok(SealedParts { head, tag })
}

/// The sending end of a KV link (a prefill worker): one ticket per link, sequence numbers
/// strictly increasing, so no (key, nonce) pair is ever used twice.
#[derive(Debug)]
pub struct KvSealer {
    link: RecordSealer,
    exporter: Exporter,
    max_frame: usize,
    ticket: Option<(TicketKey, Option<u32>)>,
}

impl KvSealer {
    /// The sender of a link whose handshake gave `keys` (the sending direction is used).
    pub fn new(keys: SessionKeys, max_frame: usize) -> Result<Self, WireError> {
        let (link, _, exporter) = keys.into_parts()?;
        Ok(Self::from_parts(link, exporter, max_frame))
    }

    /// The sender of a link whose sending direction is `link` (already used by the handshake's
    /// records: frames continue its counter).
    pub fn from_parts(link: RecordSealer, exporter: Exporter, max_frame: usize) -> Self {
        KvSealer { link, exporter, max_frame: max_frame.min(u32::MAX as usize + 4), ticket: None }
    }

    /// The ticket key, bound to the first ticket sealed; checks `seq` is past the last one.
    fn ticket_key(&mut self, id: &TicketId, seq: u32) -> Result<&TicketKey, WireError> {
        if self.ticket.is_none() {
            self.ticket = Some((self.exporter.ticket_key(id)?, None));
        }
        let Some((key, last)) = &mut self.ticket else { return Err(WireError::Crypto("ticket key")) };
        if key.ticket() != id {
            return Err(WireError::WrongTicket);
        }
        if let Some(l) = *last {
            if seq <= l {
                return Err(WireError::OutOfOrder { expected: l.saturating_add(1), got: seq });
            }
        }
        *last = Some(seq);
        Ok(key)
    }

    fn seal_frame(
        &mut self,
        ticket: &TicketId,
        seq: u32,
        kind: u8,
        fields: [u32; 5],
        body: Body<'_>,
    ) -> Result<SealedParts, WireError> {
        let total = FRAME_OVERHEAD.saturating_add(body.len());
        if total > self.max_frame {
            return Err(WireError::Oversized { len: total, max: self.max_frame });
        }
        let body_len =
            u32::try_from(body.len()).map_err(|_| WireError::Oversized { len: total, max: self.max_frame })?;
        let mut plain = [0u8; HEADER_PLAIN_LEN];
        let mut at = 0;
        let mut put = |b: &[u8]| {
            plain[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        };
        put(&FRAME_MAGIC);
        put(&WIRE_VERSION.to_le_bytes());
        put(&[kind, 0]);
        put(&ticket.nonce.0);
        put(&ticket.request.0.to_le_bytes());
        put(&ticket.tenant.0.to_le_bytes());
        put(&seq.to_le_bytes());
        for v in fields {
            put(&v.to_le_bytes());
        }
        put(&body_len.to_le_bytes());
        self.ticket_key(ticket, seq)?;
        let Some((key, _)) = &self.ticket else { return Err(WireError::Crypto("ticket key")) };
        seal_parts(&mut self.link, key, &plain, seq, body)
    }

    /// Seals a KV frame of `ticket`, encrypting its payload in place.
    pub fn seal_kv(&mut self, ticket: &TicketId, seq: u32, kv: KvFrameMut<'_>) -> Result<SealedParts, WireError> {
        check_range("layer", &kv.layers)?;
        check_range("token", &kv.tokens)?;
        let fields = [kv.page_index, kv.layers.start, kv.layers.end, kv.tokens.start, kv.tokens.end];
        self.seal_frame(ticket, seq, KIND_KV, fields, Body::InPlace(kv.payload))
    }

    /// Seals a KV frame of `ticket` whose payload lies in `kv.payload`, writing the ciphertext
    /// to `out` (resized to fit) in the same pass: for a payload the sender must keep.
    pub fn seal_kv_into(
        &mut self,
        ticket: &TicketId,
        seq: u32,
        kv: KvFrameRef<'_>,
        out: &mut Vec<u8>,
    ) -> Result<SealedParts, WireError> {
        check_range("layer", &kv.layers)?;
        check_range("token", &kv.tokens)?;
        let fields = [kv.page_index, kv.layers.start, kv.layers.end, kv.tokens.start, kv.tokens.end];
        out.resize(kv.payload.len(), 0);
        self.seal_frame(ticket, seq, KIND_KV, fields, Body::Copy { src: kv.payload, dst: out })
    }

    /// Seals the closing frame of `ticket`: the whole frame.
    pub fn seal_close(&mut self, ticket: &TicketId, seq: u32, close: &CloseFrame) -> Result<Vec<u8>, WireError> {
        let mut body = [0u8; CLOSE_LEN];
        body[..4].copy_from_slice(&close.tokens.to_le_bytes());
        body[4..36].copy_from_slice(&close.prompt_digest.0);
        body[36..].copy_from_slice(&close.first_token.to_le_bytes());
        let parts = self.seal_frame(ticket, seq, KIND_CLOSE, [0; 5], Body::InPlace(&mut body))?;
        Ok(parts.to_vec(&body))
    }

    /// Seals a hand-made header in clear and a body, as a sender holding the link's keys but
    /// not following the protocol could (a compromised prefill worker): the body key is the
    /// one of the ticket the header names; no check of the header, the ticket binding or the
    /// sequence. For fuzzing the receiver; never used by a node.
    #[cfg(feature = "fuzzing")]
    pub fn seal_raw(&mut self, plain: &[u8; HEADER_PLAIN_LEN], body: &mut [u8]) -> Result<Vec<u8>, WireError> {
        let mut r = Reader::new(&plain[8..44]);
        let ticket =
            TicketId { nonce: TicketNonce(r.array()?), request: RequestId(r.u64()?), tenant: TenantId(r.u64()?) };
        let seq = r.u32()?;
        let key = self.exporter.ticket_key(&ticket)?;
        Ok(seal_parts(&mut self.link, &key, plain, seq, Body::InPlace(body))?.to_vec(body))
    }

    /// Seals any frame into one buffer (copies the payload): tests and tools.
    pub fn seal(&mut self, frame: &Frame) -> Result<Vec<u8>, WireError> {
        match frame.borrowed().body {
            FrameBodyRef::Kv(kv) => {
                let mut payload = kv.payload.to_vec();
                let m = KvFrameMut {
                    page_index: kv.page_index,
                    layers: kv.layers,
                    tokens: kv.tokens,
                    payload: &mut payload,
                };
                Ok(self.seal_kv(&frame.ticket, frame.seq, m)?.to_vec(&payload))
            }
            FrameBodyRef::Close(c) => self.seal_close(&frame.ticket, frame.seq, &c),
        }
    }
}

/// The receiving end of a KV link (a decode worker): one ticket per link.
#[derive(Debug)]
pub struct KvOpener {
    link: RecordOpener,
    exporter: Exporter,
    max_frame: usize,
    ticket: Option<TicketKey>,
}

impl KvOpener {
    /// The receiver of a link whose handshake gave `keys` (the receiving direction is used).
    pub fn new(keys: SessionKeys, max_frame: usize) -> Result<Self, WireError> {
        let (_, link, exporter) = keys.into_parts()?;
        Ok(Self::from_parts(link, exporter, max_frame))
    }

    /// The receiver of a link whose receiving direction is `link`.
    pub fn from_parts(link: RecordOpener, exporter: Exporter, max_frame: usize) -> Self {
        KvOpener { link, exporter, max_frame: max_frame.min(u32::MAX as usize + 4), ticket: None }
    }

    /// Total size of the frame whose first bytes are `prefix` (at least 4), checked against
    /// the maximum: what a stream reader must read before calling [`KvOpener::open`].
    pub fn frame_len(&self, prefix: &[u8]) -> Result<usize, WireError> {
        frame_len(self.max_frame, prefix)
    }

    /// Authenticates and decrypts exactly one frame in place; the result borrows `bytes`.
    /// Every error but the length checks leaves the link unusable: drop it.
    pub fn open<'a>(&mut self, bytes: &'a mut [u8], tickets: &impl TicketLookup) -> Result<FrameRef<'a>, WireError> {
        let total = self.frame_len(bytes)?;
        if bytes.len() < total {
            return Err(WireError::Truncated { needed: total, had: bytes.len() });
        }
        if bytes.len() > total {
            return Err(WireError::TrailingBytes { extra: bytes.len() - total });
        }
        let (head, rest) = bytes.split_at_mut(HEADER_LEN);
        let head: &mut [u8; HEADER_LEN] = head.try_into().map_err(|_| WireError::Malformed("internal length"))?;
        let header = self.open_header(head, tickets)?;
        self.open_body(header, rest)
    }

    /// Authenticates and decrypts the first [`HEADER_LEN`] bytes of a frame (length prefix,
    /// sealed header, tag) in place. A stream reader reads these, a fixed size, before it
    /// reads or makes room for the body: the length it then trusts is one the link key
    /// authenticated, for a ticket this node holds. Every error but the length checks leaves
    /// the link unusable: drop it.
    pub fn open_header(
        &mut self,
        head: &mut [u8; HEADER_LEN],
        tickets: &impl TicketLookup,
    ) -> Result<OpenedHeader, WireError> {
        let total = self.frame_len(head)?;
        let (len, sealed) = head.split_at_mut(4);
        let (hdr, hdr_tag) = sealed.split_at_mut(HEADER_PLAIN_LEN);
        self.link.open(len, hdr, hdr_tag)?;
        // The header is authentic from here on.
        let mut plain = [0u8; HEADER_PLAIN_LEN];
        plain.copy_from_slice(hdr);
        let mut r = Reader::new(&plain);
        if r.array::<4>()? != FRAME_MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = r.u16()?;
        if version != WIRE_VERSION {
            return Err(WireError::BadVersion { got: version, supported: WIRE_VERSION });
        }
        let kind = r.u8()?;
        if r.u8()? != 0 {
            return Err(WireError::Malformed("reserved flags set"));
        }
        let nonce = TicketNonce(r.array::<16>()?);
        let ticket = TicketId { nonce, request: RequestId(r.u64()?), tenant: TenantId(r.u64()?) };
        let seq = r.u32()?;
        let page_index = r.u32()?;
        let layers = r.u32()?..r.u32()?;
        let tokens = r.u32()?..r.u32()?;
        let body_len = r.u32()? as usize;
        r.finish()?;
        if body_len != total - FRAME_OVERHEAD {
            return Err(WireError::Malformed("body length disagrees with frame length"));
        }
        match &self.ticket {
            Some(k) if k.ticket() == &ticket => {}
            Some(_) => return Err(WireError::WrongTicket),
            None => {
                if !tickets.holds(&nonce) {
                    return Err(WireError::UnknownTicket);
                }
                self.ticket = Some(self.exporter.ticket_key(&ticket)?);
            }
        }
        Ok(OpenedHeader { plain, kind, ticket, seq, page_index, layers, tokens, body_len })
    }

    /// Authenticates and decrypts the rest of the frame whose header `header` is (the body
    /// and its tag, exactly [`OpenedHeader::rest_len`] bytes) in place; the result borrows
    /// `rest`. Every error leaves the link unusable: drop it.
    pub fn open_body<'a>(&mut self, header: OpenedHeader, rest: &'a mut [u8]) -> Result<FrameRef<'a>, WireError> {
        let OpenedHeader { plain, kind, ticket, seq, page_index, layers, tokens, body_len } = header;
        let want = body_len + AEAD_TAG_LEN;
        if rest.len() < want {
            return Err(WireError::Truncated { needed: want, had: rest.len() });
        }
        if rest.len() > want {
            return Err(WireError::TrailingBytes { extra: rest.len() - want });
        }
        // Opening the header bound the link to its ticket's key.
        let key = match &self.ticket {
            Some(k) if k.ticket() == &ticket => k,
            _ => return Err(WireError::WrongTicket),
        };
        let (body, body_tag) = rest.split_at_mut(body_len);
        key.open(seq, &plain, body, body_tag)?;
        let body: &'a [u8] = body;
        let body = match kind {
            KIND_KV => {
                check_range("layer", &layers)?;
                check_range("token", &tokens)?;
                FrameBodyRef::Kv(KvFrameRef { page_index, layers, tokens, payload: body })
            }
            KIND_CLOSE => {
                if page_index != 0 || layers != (0..0) || tokens != (0..0) || body.len() != CLOSE_LEN {
                    return Err(WireError::Malformed("closing frame with KV fields"));
                }
                let mut r = Reader::new(body);
                let tokens = r.u32()?;
                let prompt_digest = PromptDigest(r.array::<32>()?);
                let first_token = r.u32()?;
                r.finish()?;
                FrameBodyRef::Close(CloseFrame { tokens, prompt_digest, first_token })
            }
            _ => return Err(WireError::Malformed("unknown frame kind")),
        };
        Ok(FrameRef { ticket, seq, body })
    }

    /// [`KvOpener::open`] on a copy of `bytes`, into an owned frame: tests and tools.
    pub fn open_owned(&mut self, bytes: &[u8], tickets: &impl TicketLookup) -> Result<Frame, WireError> {
        let mut copy = bytes.to_vec();
        self.open(&mut copy, tickets).map(FrameRef::into_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameBody;
    use crate::testutil::*;
    use proptest::prelude::*;

    fn seal_all(frames: &[Frame]) -> Vec<Vec<u8>> {
        let (mut s, _) = link();
        frames.iter().map(|f| s.seal(f).unwrap_or_else(|e| panic!("{e}"))).collect()
    }

    fn open_all(stream: &[Vec<u8>]) -> Result<Vec<Frame>, WireError> {
        let (_, mut o) = link();
        stream.iter().map(|b| o.open_owned(b, &tickets())).collect()
    }

    #[test]
    fn round_trip_of_every_honest_frame() {
        let frames = honest_frames(&ticket());
        let stream = seal_all(&frames);
        for b in &stream {
            assert_eq!(link().1.frame_len(b), Ok(b.len()));
        }
        assert_eq!(open_all(&stream), Ok(frames));
    }

    #[test]
    fn nothing_of_a_frame_is_readable_on_the_wire() {
        let f = kv(&ticket(), 0, 0, 0..3, 0..4);
        let FrameBody::Kv(k) = &f.body else { panic!("not a KV frame") };
        let bytes = seal_all(std::slice::from_ref(&f)).remove(0);
        let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        assert!(!contains(&k.payload[..16]));
        assert!(!contains(&ticket().nonce.0[..8]));
        assert!(!contains(&FRAME_MAGIC));
        let mut ids = ticket().request.0.to_le_bytes().to_vec();
        ids.extend_from_slice(&ticket().tenant.0.to_le_bytes());
        assert!(!contains(&ids));
        let c = seal_all(&[close(&ticket(), 0, &prompt())]).remove(0);
        assert!(!c.windows(8).any(|w| w == &PromptDigest::of(&prompt()).0[..8]));
    }

    #[test]
    fn sealing_in_place_leaves_the_payload_where_it_is_and_opening_decrypts_in_place() {
        let (mut s, mut o) = link();
        let mut payload: Vec<u8> = (0..48u8).collect();
        let before = payload.clone();
        let m = KvFrameMut { page_index: 1, layers: 0..3, tokens: 4..8, payload: &mut payload };
        let parts = s.seal_kv(&ticket().id(), 0, m).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(payload, before, "encrypted where it lies");
        let mut bytes = parts.to_vec(&payload);
        let base = bytes.as_ptr() as usize;
        let f = o.open(&mut bytes, &tickets()).unwrap_or_else(|e| panic!("{e}"));
        let FrameBodyRef::Kv(kv) = &f.body else { panic!("not a KV frame") };
        assert_eq!(kv.payload, &before[..]);
        assert_eq!(kv.payload.as_ptr() as usize, base + HEADER_LEN);
    }

    #[test]
    fn sealing_from_a_source_gives_the_bytes_of_sealing_in_place_and_keeps_the_source() {
        let (mut a, _) = link();
        let (mut b, mut o) = link();
        let source: Vec<u8> = (0..48u8).collect();
        let mut copy = source.clone();
        let m = KvFrameMut { page_index: 1, layers: 0..3, tokens: 4..8, payload: &mut copy };
        let in_place = a.seal_kv(&ticket().id(), 0, m).unwrap_or_else(|e| panic!("{e}")).to_vec(&copy);
        let mut out = Vec::new();
        let r = KvFrameRef { page_index: 1, layers: 0..3, tokens: 4..8, payload: &source };
        let parts = b.seal_kv_into(&ticket().id(), 0, r, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parts.to_vec(&out), in_place);
        assert_eq!(source, (0..48u8).collect::<Vec<_>>());
        let opened = o.open_owned(&in_place, &tickets()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opened, kv_with(&ticket(), 0, 1, 0..3, 4..8, source));
    }

    #[test]
    fn flipping_any_byte_is_rejected() {
        for f in [kv(&ticket(), 0, 0, 0..2, 0..4), close(&ticket(), 0, &prompt())] {
            let bytes = seal_all(std::slice::from_ref(&f)).remove(0);
            for i in 0..bytes.len() {
                let mut b = bytes.clone();
                b[i] ^= 0x01;
                let err = link().1.open_owned(&b, &tickets()).err();
                let ok = match i {
                    0..=3 => matches!(
                        err,
                        Some(
                            WireError::Truncated { .. } | WireError::TrailingBytes { .. } | WireError::Oversized { .. }
                        )
                    ),
                    _ => err == Some(WireError::BadMac),
                };
                assert!(ok, "byte {i}: {err:?}");
            }
        }
    }

    #[test]
    fn a_dropped_repeated_reordered_or_foreign_frame_fails_authentication() {
        let stream = seal_all(&honest_frames(&ticket()));
        let mut dropped = stream.clone();
        dropped.remove(1);
        let mut repeated = stream.clone();
        repeated.insert(2, stream[1].clone());
        let mut reordered = stream.clone();
        reordered.swap(1, 2);
        // The same frames sealed on another link (another connection's keys).
        let (mut other, _) = link_with([9; 32]);
        let mut foreign = stream.clone();
        foreign[1] = other.seal(&honest_frames(&ticket())[1]).unwrap_or_default();
        for s in [dropped, repeated, reordered, foreign] {
            assert_eq!(open_all(&s).err(), Some(WireError::BadMac));
        }
    }

    #[test]
    fn every_truncation_is_rejected_as_truncated() {
        let bytes = seal_all(&[kv(&ticket(), 0, 0, 0..3, 0..4)]).remove(0);
        for n in 0..bytes.len() {
            assert!(
                matches!(link().1.open_owned(&bytes[..n], &tickets()), Err(WireError::Truncated { .. })),
                "prefix {n}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(link().1.open_owned(&long, &tickets()), Err(WireError::TrailingBytes { extra: 1 }));
    }

    #[test]
    fn unknown_tickets_are_dropped_and_a_link_carries_one_ticket() {
        let bytes = seal_all(&[kv(&ticket(), 0, 0, 0..2, 0..4)]).remove(0);
        let none = |_: &TicketNonce| false;
        assert_eq!(link().1.open_owned(&bytes, &none), Err(WireError::UnknownTicket));
        // The sender refuses a second ticket on a link, and a sequence number not past the last.
        let (mut s, _) = link();
        assert!(s.seal(&kv(&ticket(), 0, 0, 0..2, 0..4)).is_ok());
        assert_eq!(s.seal(&kv(&other_ticket(), 1, 0, 0..2, 0..4)).err(), Some(WireError::WrongTicket));
        assert!(matches!(s.seal(&kv(&ticket(), 0, 1, 0..2, 0..4)), Err(WireError::OutOfOrder { .. })));
        // So does the receiver, whatever the sender does: two sealers of one session, the
        // second sealing another ticket as the link's second record.
        let (mut a, mut o) = link();
        let (mut b, _) = link();
        let first = a.seal(&kv(&ticket(), 0, 0, 0..2, 0..4)).unwrap_or_default();
        let _ = b.seal(&kv(&other_ticket(), 0, 0, 0..2, 0..4));
        let second = b.seal(&kv(&other_ticket(), 1, 0, 2..3, 0..4)).unwrap_or_default();
        assert!(o.open_owned(&first, &tickets()).is_ok());
        assert_eq!(o.open_owned(&second, &tickets()), Err(WireError::WrongTicket));
    }

    #[test]
    fn oversized_length_is_refused_from_the_prefix_alone() {
        let small = KvOpener::new(session(false, [3; 32]), 64).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(small.frame_len(&[200, 0, 0, 0]), Err(WireError::Oversized { .. })));
        assert!(matches!(small.frame_len(&u32::MAX.to_le_bytes()), Err(WireError::Oversized { .. })));
        assert!(matches!(small.frame_len(&[1, 0]), Err(WireError::Truncated { .. })));
        let (mut s, _) = link();
        let huge = kv(&ticket(), 0, 0, 0..1, 0..1);
        let mut tiny = KvSealer::new(session(true, [3; 32]), 64).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(tiny.seal(&huge), Err(WireError::Oversized { .. })));
        assert!(s.seal(&huge).is_ok());
    }

    #[test]
    fn a_stream_reader_opening_the_header_then_the_body_gets_what_opening_the_whole_frame_gives() {
        let frames = honest_frames(&ticket());
        let (_, mut o) = link();
        for (bytes, want) in seal_all(&frames).iter().zip(&frames) {
            let mut head: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap_or_else(|e| panic!("{e}"));
            let header = o.open_header(&mut head, &tickets()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(HEADER_LEN + header.rest_len(), bytes.len());
            let mut rest = bytes[HEADER_LEN..].to_vec();
            assert_eq!(o.open_body(header, &mut rest).map(FrameRef::into_owned).as_ref(), Ok(want));
        }
    }

    #[test]
    fn a_header_claiming_a_large_frame_is_refused_from_its_fixed_size_head_alone() {
        // Forged: anything after a length of the largest frame.
        let mut head = [0x5a; HEADER_LEN];
        head[..4].copy_from_slice(&((DEFAULT_MAX_FRAME - 4) as u32).to_le_bytes());
        assert_eq!(link().1.open_header(&mut head, &tickets()), Err(WireError::BadMac));
        // Authentic, for a ticket the receiver does not hold: refused before any body byte.
        let (mut s, mut o) = link();
        let mut payload = vec![0u8; 64 << 10];
        let kv = KvFrameMut { page_index: 0, layers: 0..1, tokens: 0..1, payload: &mut payload };
        let mut head = s.seal_kv(&ticket().id(), 0, kv).unwrap_or_else(|e| panic!("{e}")).head;
        assert_eq!(o.open_header(&mut head, &|_: &TicketNonce| false), Err(WireError::UnknownTicket));
        // Past the largest frame: refused from the length.
        let mut head = [0; HEADER_LEN];
        head[..4].copy_from_slice(&((DEFAULT_MAX_FRAME - 3) as u32).to_le_bytes());
        assert!(matches!(link().1.open_header(&mut head, &tickets()), Err(WireError::Oversized { .. })));
    }

    #[test]
    fn a_body_of_another_length_than_its_header_says_is_refused() {
        let bytes = seal_all(&[kv(&ticket(), 0, 0, 0..3, 0..4)]).remove(0);
        for cut in [1usize, 0] {
            let (_, mut o) = link();
            let mut head: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap_or_else(|e| panic!("{e}"));
            let header = o.open_header(&mut head, &tickets()).unwrap_or_else(|e| panic!("{e}"));
            let mut rest = bytes[HEADER_LEN..bytes.len() - cut].to_vec();
            if cut == 0 {
                rest.push(0);
                assert_eq!(o.open_body(header, &mut rest).err(), Some(WireError::TrailingBytes { extra: 1 }));
            } else {
                assert!(matches!(o.open_body(header, &mut rest), Err(WireError::Truncated { .. })));
            }
        }
    }

    #[test]
    fn empty_or_inverted_ranges_are_refused_when_sealing() {
        let (mut s, _) = link();
        let bad =
            Frame::kv(ticket().id(), 0, crate::KvFrame { page_index: 0, layers: 2..2, tokens: 0..4, payload: vec![] });
        assert!(matches!(s.seal(&bad), Err(WireError::BadRange { what: "layer", .. })));
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = 5..4;
        let bad = Frame::kv(
            ticket().id(),
            0,
            crate::KvFrame { page_index: 0, layers: 0..1, tokens: inverted, payload: vec![] },
        );
        assert!(matches!(s.seal(&bad), Err(WireError::BadRange { what: "token", .. })));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = link().1.open_owned(&bytes, &tickets());
            let mut framed = ((bytes.len()) as u32).to_le_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            prop_assert!(link().1.open_owned(&framed, &tickets()).is_err());
        }

        #[test]
        fn mutations_of_a_sealed_frame_never_open(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
            splice in proptest::option::of((any::<prop::sample::Index>(), 0usize..40, proptest::collection::vec(any::<u8>(), 0..40))),
        ) {
            let f = kv(&ticket(), 0, 1, 0..3, 4..8);
            let genuine = seal_all(std::slice::from_ref(&f)).remove(0);
            let mut b = genuine.clone();
            for (at, x) in &flips {
                let i = at.index(b.len());
                b[i] ^= x;
            }
            if let Some((at, n, with)) = splice {
                let i = at.index(b.len());
                let end = (i + n).min(b.len());
                b.splice(i..end, with);
            }
            if b != genuine {
                prop_assert!(link().1.open_owned(&b, &tickets()).is_err());
            }
        }

        #[test]
        fn arbitrary_kv_frames_round_trip(seq in any::<u32>(), page in any::<u32>(), l0 in 0u32..100, ln in 1u32..100,
                                          t0 in 0u32..u32::MAX - 200, tn in 1u32..100, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let f = Frame::kv(ticket().id(), seq, crate::KvFrame { page_index: page, layers: l0..l0 + ln, tokens: t0..t0 + tn, payload });
            prop_assert_eq!(open_all(&seal_all(std::slice::from_ref(&f))), Ok(vec![f]));
        }
    }
}
