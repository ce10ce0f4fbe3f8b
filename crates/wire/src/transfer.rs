//! The decode worker's side of a KV transfer, as a typed state machine.
//!
//! A [`Transfer<Receiving>`] is built from what the *receiver* reserved (its ticket, its own KV
//! geometry) and the prompt the gateway admitted. Each verified frame is checked against that,
//! never against what the sender claims; accepted frames yield a [`PageWrite`] telling the
//! caller exactly which slots of which reserved page to fill. Every method consumes the
//! transfer, so an error leaves no transfer behind to keep using: the request fails (fail
//! closed). [`Transfer<Complete>`] exists only when the closing frame matched the admitted
//! prompt (token count and digest) and every (layer, prompt token) slot was written once.

use crate::error::WireError;
use crate::frame::{Frame, FrameBodyRef, FrameRef, PromptDigest, Ticket, TicketId};
use kv::KvLayout;
use std::ops::Range;

/// The receiver's own KV geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Token slots per page.
    pub page_size: u32,
    pub n_layers: u32,
    /// Bytes of K (or of V) for one token at one layer: `n_kv_heads * head_dim * dtype bytes`.
    pub row_bytes: u32,
}

impl Geometry {
    /// The geometry of a KV pool layout.
    pub fn from_layout(layout: &KvLayout) -> Result<Self, WireError> {
        let big = |_| WireError::Reservation("layout dimensions do not fit the wire format");
        let row = layout.row_len().checked_mul(layout.dtype.bytes());
        Ok(Geometry {
            page_size: u32::try_from(layout.page_size).map_err(big)?,
            n_layers: u32::try_from(layout.n_layers).map_err(big)?,
            row_bytes: u32::try_from(row.unwrap_or(usize::MAX)).map_err(big)?,
        })
    }

    /// Payload bytes of a frame covering `layers` x `tokens` (K and V), if it fits in u64.
    pub fn payload_len(&self, layers: u32, tokens: u32) -> Option<u64> {
        (layers as u64).checked_mul(tokens as u64)?.checked_mul(2)?.checked_mul(self.row_bytes as u64)
    }
}

/// State: frames are being received.
#[derive(Debug)]
pub struct Receiving {
    next_seq: u32,
    /// One bit per (layer, prompt token): `layer * tokens + token`.
    covered: Vec<u64>,
    written: u64,
}

/// State: the transfer is closed and verified; decoding may start.
#[derive(Debug)]
pub struct Complete {
    first_token: u32,
    frames: u32,
}

/// A transfer for one ticket, in state `S`.
#[derive(Debug)]
pub struct Transfer<S> {
    ticket: Ticket,
    geometry: Geometry,
    digest: PromptDigest,
    state: S,
}

/// What the caller must write for an accepted KV frame: `slots` (offsets inside the page) of
/// reserved page `page_index`, for `layers`, from `payload` (layout in [`crate::KvFrame`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageWrite<'f> {
    pub page_index: u32,
    pub slots: Range<u32>,
    pub layers: Range<u32>,
    pub payload: &'f [u8],
}

/// The outcome of an accepted frame.
#[derive(Debug)]
pub enum Received<'f> {
    /// A KV frame was accepted; write it, then keep receiving.
    Written(Transfer<Receiving>, PageWrite<'f>),
    /// The closing frame was accepted: every reserved prompt slot is written and verified.
    Complete(Transfer<Complete>),
}

impl<S> Transfer<S> {
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
}

impl Transfer<Receiving> {
    /// Starts receiving for `ticket`, whose `tokens` must be the length of `admitted_prompt`,
    /// whose `pages` must hold it and whose `held` leading tokens (whole pages before the
    /// prompt's last token) the receiver holds already: only the rest is expected.
    pub fn new(ticket: Ticket, geometry: Geometry, admitted_prompt: &[u32]) -> Result<Self, WireError> {
        if geometry.page_size == 0 || geometry.n_layers == 0 || geometry.row_bytes == 0 {
            return Err(WireError::Reservation("geometry has a zero dimension"));
        }
        if u32::try_from(admitted_prompt.len()).ok() != Some(ticket.tokens) {
            return Err(WireError::Reservation("ticket token count differs from the admitted prompt"));
        }
        if ticket.tokens == 0 {
            return Err(WireError::Reservation("empty prompt"));
        }
        if (ticket.pages as u64) * (geometry.page_size as u64) < ticket.tokens as u64 {
            return Err(WireError::Reservation("reserved pages cannot hold the prompt"));
        }
        if ticket.held >= ticket.tokens || !ticket.held.is_multiple_of(geometry.page_size) {
            return Err(WireError::Reservation("held tokens are not whole pages before the prompt's last"));
        }
        let bits = geometry.n_layers as u64 * ticket.tokens as u64;
        let words = usize::try_from(bits.div_ceil(64)).map_err(|_| WireError::Reservation("coverage map too large"))?;
        let mut transfer = Transfer {
            ticket,
            geometry,
            digest: PromptDigest::of(admitted_prompt),
            state: Receiving { next_seq: 0, covered: vec![0; words], written: 0 },
        };
        // What the receiver holds counts as written: a frame for it is a duplicate, and the
        // close still needs every other (layer, token) slot.
        if ticket.held > 0 {
            transfer.mark(0, &(0..geometry.n_layers), &(0..ticket.held))?;
        }
        Ok(transfer)
    }

    /// (layer, prompt token) slots not yet written.
    pub fn missing(&self) -> u64 {
        self.geometry.n_layers as u64 * self.ticket.tokens as u64 - self.state.written
    }

    /// Sequence number the next frame must carry.
    pub fn next_seq(&self) -> u32 {
        self.state.next_seq
    }

    /// Checks one decoded (MAC-verified) frame against the reservation and the admitted prompt.
    pub fn receive(self, frame: &Frame) -> Result<Received<'_>, WireError> {
        self.receive_ref(&frame.borrowed())
    }

    /// [`Transfer::receive`] for a frame from [`crate::Codec::decode_borrowed`]: the same
    /// checks; the accepted [`PageWrite`] borrows the payload from the decoded bytes.
    pub fn receive_ref<'f>(mut self, frame: &FrameRef<'f>) -> Result<Received<'f>, WireError> {
        self.check_header(frame.ticket, frame.seq)?;
        match &frame.body {
            FrameBodyRef::Kv(kv) => {
                let (page, layers, tokens) = (kv.page_index, kv.layers.clone(), kv.tokens.clone());
                if page >= self.ticket.pages {
                    return Err(WireError::PageOutOfRange { page, pages: self.ticket.pages });
                }
                if layers.start >= layers.end {
                    return Err(WireError::BadRange { what: "layer", start: layers.start, end: layers.end });
                }
                if tokens.start >= tokens.end {
                    return Err(WireError::BadRange { what: "token", start: tokens.start, end: tokens.end });
                }
                if layers.end > self.geometry.n_layers {
                    return Err(WireError::LayerOutOfRange { end: layers.end, layers: self.geometry.n_layers });
                }
                if tokens.end > self.ticket.tokens {
                    return Err(WireError::TokenOutOfRange { end: tokens.end, tokens: self.ticket.tokens });
                }
                let ps = self.geometry.page_size as u64;
                let page_start = page as u64 * ps;
                if (tokens.start as u64) < page_start || tokens.end as u64 > page_start + ps {
                    return Err(WireError::TokensOutsidePage { page, start: tokens.start, end: tokens.end });
                }
                let n_tokens = tokens.end - tokens.start;
                let expected = self.geometry.payload_len(layers.end - layers.start, n_tokens);
                let got = kv.payload.len() as u64;
                if expected != Some(got) {
                    return Err(WireError::PayloadLength { expected: expected.unwrap_or(u64::MAX), got });
                }
                self.mark(page, &layers, &tokens)?;
                self.state.next_seq = next(frame.seq)?;
                // page_start <= tokens.start < tokens.end <= page_start + page_size.
                let offset = (tokens.start as u64 - page_start) as u32;
                let slots = offset..offset + n_tokens;
                let write = PageWrite { page_index: page, slots, layers, payload: kv.payload };
                Ok(Received::Written(self, write))
            }
            FrameBodyRef::Close(close) => {
                if close.tokens != self.ticket.tokens {
                    return Err(WireError::TokenCount { expected: self.ticket.tokens, got: close.tokens });
                }
                if !close.prompt_digest.matches(&self.digest) {
                    return Err(WireError::PromptDigest);
                }
                let missing = self.missing();
                if missing != 0 {
                    return Err(WireError::Incomplete { missing });
                }
                let state = Complete { first_token: close.first_token, frames: frame.seq };
                Ok(Received::Complete(Transfer {
                    ticket: self.ticket,
                    geometry: self.geometry,
                    digest: self.digest,
                    state,
                }))
            }
        }
    }

    fn check_header(&self, ticket: TicketId, seq: u32) -> Result<(), WireError> {
        if ticket != self.ticket.id() {
            return Err(WireError::WrongTicket);
        }
        if seq != self.state.next_seq {
            return Err(WireError::OutOfOrder { expected: self.state.next_seq, got: seq });
        }
        Ok(())
    }

    /// Marks the slots, refusing any already written: all of them (duplicate) or some (overlap).
    fn mark(&mut self, page: u32, layers: &Range<u32>, tokens: &Range<u32>) -> Result<(), WireError> {
        let n = self.ticket.tokens as u64;
        let bit = |l: u32, t: u32| l as u64 * n + t as u64;
        let mut first_set = None;
        let mut set = 0u64;
        for l in layers.clone() {
            for t in tokens.clone() {
                let b = bit(l, t);
                if self.state.covered[(b / 64) as usize] & (1 << (b % 64)) != 0 {
                    set += 1;
                    first_set.get_or_insert((l, t));
                }
            }
        }
        let total = (layers.end - layers.start) as u64 * (tokens.end - tokens.start) as u64;
        if let Some((layer, token)) = first_set {
            return Err(if set == total { WireError::Duplicate { page } } else { WireError::Overlap { layer, token } });
        }
        for l in layers.clone() {
            for t in tokens.clone() {
                let b = bit(l, t);
                self.state.covered[(b / 64) as usize] |= 1 << (b % 64);
            }
        }
        self.state.written += total;
        Ok(())
    }
}

impl Transfer<Complete> {
    /// The first token sampled by the prefill worker.
    pub fn first_token(&self) -> u32 {
        self.state.first_token
    }

    /// KV frames accepted before the close.
    pub fn frames(&self) -> u32 {
        self.state.frames
    }

    /// The verdict on any frame arriving after the close: always an error.
    pub fn reject(&self, frame: &Frame) -> WireError {
        self.reject_ref(&frame.borrowed())
    }

    /// [`Transfer::reject`] for a borrowed frame.
    pub fn reject_ref(&self, frame: &FrameRef<'_>) -> WireError {
        if frame.ticket == self.ticket.id() {
            WireError::AfterClose
        } else {
            WireError::WrongTicket
        }
    }
}

fn next(seq: u32) -> Result<u32, WireError> {
    seq.checked_add(1).ok_or(WireError::OutOfOrder { expected: u32::MAX, got: seq })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{CloseFrame, FrameBody};
    use crate::testutil::*;
    use proptest::prelude::*;

    fn start() -> Transfer<Receiving> {
        Transfer::new(ticket(), GEOM, &prompt()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Feeds frames in order; Ok(complete transfer) or the first error.
    fn run(frames: &[Frame]) -> Result<Transfer<Complete>, WireError> {
        let mut t = start();
        for f in frames {
            match t.receive(f)? {
                Received::Written(next, _) => t = next,
                Received::Complete(done) => return Ok(done),
            }
        }
        Err(WireError::Incomplete { missing: t.missing() })
    }

    /// Renumbers frames 0.. in the order given, as a sender would.
    fn renumber(mut frames: Vec<Frame>) -> Vec<Frame> {
        for (i, f) in frames.iter_mut().enumerate() {
            f.seq = i as u32;
        }
        frames
    }

    #[test]
    fn honest_transfer_completes_with_the_first_token() {
        let done = run(&honest_frames(&ticket())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(done.first_token(), 42);
        assert_eq!(done.frames(), 6);
        assert_eq!(done.ticket(), &ticket());
    }

    #[test]
    fn a_receiver_holding_leading_pages_expects_only_the_rest_and_refuses_both_a_held_page_and_a_gap() {
        let held = Ticket { held: 8, ..ticket() };
        let rest = |t: &Ticket| {
            let mut out = vec![kv(t, 0, 2, 0..3, 8..10)];
            out.push(close(t, 1, &prompt()));
            out
        };
        // Only page 2 (tokens 8..10) crosses; the close still names the whole prompt.
        let mut t = Transfer::new(held, GEOM, &prompt()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.missing(), 3 * 2);
        for f in rest(&held) {
            match t.receive(&f).unwrap_or_else(|e| panic!("{e}")) {
                Received::Written(next, _) => t = next,
                Received::Complete(done) => {
                    assert_eq!(done.first_token(), 42);
                    break;
                }
            }
        }
        // A sender that resends a held page is refused (the page counts as written).
        let t = Transfer::new(held, GEOM, &prompt()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.receive(&kv(&held, 0, 1, 0..3, 4..8)).err(), Some(WireError::Duplicate { page: 1 }));
        // A sender told the receiver holds less than it does still cannot close early: the
        // receiver's own count decides, so a sender skipping a page it lacks leaves a gap.
        let less = Ticket { held: 4, ..ticket() };
        let mut t = Transfer::new(less, GEOM, &prompt()).unwrap_or_else(|e| panic!("{e}"));
        let Ok(Received::Written(next, _)) = t.receive(&kv(&less, 0, 2, 0..3, 8..10)) else { panic!("refused") };
        t = next;
        assert_eq!(t.receive(&close(&less, 1, &prompt())).err(), Some(WireError::Incomplete { missing: 12 }));
        // Held tokens must be whole pages before the prompt's last token.
        for bad in [3, 10, 12] {
            let e = Transfer::new(Ticket { held: bad, ..ticket() }, GEOM, &prompt()).err();
            assert!(matches!(e, Some(WireError::Reservation(_))), "held {bad}: {e:?}");
        }
    }

    #[test]
    fn accepted_frame_tells_which_page_slots_and_layers_to_write() {
        let f = kv(&ticket(), 0, 2, 1..3, 9..10);
        let Ok(Received::Written(t, w)) = start().receive(&f) else { panic!("refused") };
        assert_eq!((w.page_index, w.slots, w.layers), (2, 1..2, 1..3));
        assert_eq!(w.payload.len(), 8); // 2 layers x 1 token x (K + V) x 2 bytes
        assert_eq!(t.missing(), 30 - 2);
        assert_eq!(t.next_seq(), 1);
    }

    #[test]
    fn missing_frame_fails_the_close_as_incomplete() {
        let mut frames = honest_frames(&ticket());
        frames.remove(3); // page 1, layer 2, 4 tokens
        let frames = renumber(frames);
        assert_eq!(run(&frames).err(), Some(WireError::Incomplete { missing: 4 }));
    }

    #[test]
    fn replayed_frame_is_out_of_order_and_a_renumbered_one_a_duplicate() {
        let mut frames = honest_frames(&ticket());
        let again = frames[1].clone();
        frames.insert(2, again);
        assert_eq!(run(&frames).err(), Some(WireError::OutOfOrder { expected: 2, got: 1 }));
        assert_eq!(run(&renumber(frames)).err(), Some(WireError::Duplicate { page: 0 }));
    }

    #[test]
    fn overlapping_frame_is_rejected() {
        let frames = vec![kv(&ticket(), 0, 0, 0..2, 0..4), kv(&ticket(), 1, 0, 1..3, 2..3)];
        assert_eq!(run(&frames).err(), Some(WireError::Overlap { layer: 1, token: 2 }));
    }

    #[test]
    fn reordered_frames_are_rejected() {
        let mut frames = honest_frames(&ticket());
        frames.swap(2, 3);
        assert_eq!(run(&frames).err(), Some(WireError::OutOfOrder { expected: 2, got: 3 }));
    }

    #[test]
    fn frame_of_another_ticket_is_rejected() {
        let mut frames = honest_frames(&ticket());
        frames[2] = kv(&other_ticket(), 2, 1, 0..2, 4..8);
        assert_eq!(run(&frames).err(), Some(WireError::WrongTicket));
        // Same nonce but another request or tenant: still another ticket.
        let mut f = kv(&ticket(), 0, 0, 0..2, 0..4);
        f.ticket.tenant = other_ticket().tenant;
        assert_eq!(start().receive(&f).err(), Some(WireError::WrongTicket));
    }

    #[test]
    fn page_beyond_the_reservation_is_rejected() {
        let f = kv(&ticket(), 0, 4, 0..1, 0..1);
        assert_eq!(start().receive(&f).err(), Some(WireError::PageOutOfRange { page: 4, pages: 4 }));
    }

    #[test]
    fn tokens_beyond_the_admitted_prompt_are_rejected_even_inside_reserved_pages() {
        let f = kv(&ticket(), 0, 2, 0..1, 8..12);
        assert_eq!(start().receive(&f).err(), Some(WireError::TokenOutOfRange { end: 12, tokens: 10 }));
    }

    #[test]
    fn tokens_outside_the_named_page_are_rejected() {
        let f = kv(&ticket(), 0, 1, 0..1, 2..6);
        assert_eq!(start().receive(&f).err(), Some(WireError::TokensOutsidePage { page: 1, start: 2, end: 6 }));
    }

    #[test]
    fn layers_beyond_the_model_are_rejected() {
        let f = kv(&ticket(), 0, 0, 2..4, 0..4);
        assert_eq!(start().receive(&f).err(), Some(WireError::LayerOutOfRange { end: 4, layers: 3 }));
    }

    #[test]
    fn payload_of_the_wrong_size_is_rejected() {
        let mut f = kv(&ticket(), 0, 0, 0..1, 0..4);
        if let FrameBody::Kv(k) = &mut f.body {
            k.payload.pop();
        }
        assert_eq!(start().receive(&f).err(), Some(WireError::PayloadLength { expected: 16, got: 15 }));
    }

    #[test]
    fn close_with_a_wrong_token_count_is_rejected() {
        let mut frames = honest_frames(&ticket());
        if let Some(FrameBody::Close(c)) = frames.last_mut().map(|f| &mut f.body) {
            c.tokens = 9;
        }
        assert_eq!(run(&frames).err(), Some(WireError::TokenCount { expected: 10, got: 9 }));
    }

    #[test]
    fn close_with_the_digest_of_another_prompt_is_rejected() {
        let mut frames = honest_frames(&ticket());
        let mut other = prompt();
        other[9] += 1;
        let last = frames.len() - 1;
        frames[last] = close(&ticket(), last as u32, &other);
        assert_eq!(run(&frames).err(), Some(WireError::PromptDigest));
    }

    #[test]
    fn frame_after_close_is_rejected() {
        let frames = honest_frames(&ticket());
        let done = run(&frames).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(done.reject(&frames[0]), WireError::AfterClose);
        assert_eq!(done.reject(&kv(&other_ticket(), 0, 0, 0..1, 0..1)), WireError::WrongTicket);
    }

    /// The 2026 incident: decode reserved for a 10-token prompt, prefill sent one token.
    #[test]
    fn one_token_placeholder_transfer_never_completes_a_longer_reservation() {
        let one = kv(&ticket(), 0, 0, 0..3, 0..1);
        let placeholder_close = close(&ticket(), 1, &[100]);
        assert_eq!(run(&[one.clone(), placeholder_close]).err(), Some(WireError::TokenCount { expected: 10, got: 1 }));
        // Even a close that claims the full prompt fails on coverage.
        assert_eq!(run(&[one, close(&ticket(), 1, &prompt())]).err(), Some(WireError::Incomplete { missing: 27 }));
    }

    #[test]
    fn reservation_that_cannot_hold_the_prompt_is_refused() {
        let mut t = ticket();
        t.pages = 2;
        assert!(matches!(Transfer::new(t, GEOM, &prompt()), Err(WireError::Reservation(_))));
        assert!(matches!(Transfer::new(ticket(), GEOM, &prompt()[..9]), Err(WireError::Reservation(_))));
        let zero = Geometry { n_layers: 0, ..GEOM };
        assert!(matches!(Transfer::new(ticket(), zero, &prompt()), Err(WireError::Reservation(_))));
    }

    #[test]
    fn geometry_from_layout_counts_k_row_bytes() {
        let layout = kv::KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: kv::KvDtype::F16 };
        let g = Geometry::from_layout(&layout).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g, Geometry { page_size: 16, n_layers: 30, row_bytes: 384 });
        assert_eq!(g.payload_len(30, 16), Some(layout.page_bytes() as u64));
    }

    #[test]
    fn sealed_stream_completes_through_the_codec_and_a_foreign_frame_fails_it() {
        let (mut s, mut o) = link();
        let decoded: Result<Vec<Frame>, WireError> =
            honest_frames(&ticket()).iter().map(|f| s.seal(f).and_then(|b| o.open_owned(&b, &tickets()))).collect();
        let decoded = decoded.unwrap_or_else(|e| panic!("{e}"));
        assert!(run(&decoded).is_ok());
        // Authentic on its own link, but for another ticket the receiver also holds: the link
        // opens it, the transfer refuses it.
        let (mut s, mut o) = link_with([4; 32]);
        let foreign = s
            .seal(&kv(&other_ticket(), 0, 0, 0..2, 0..4))
            .and_then(|b| o.open_owned(&b, &tickets()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(start().receive(&foreign).err(), Some(WireError::WrongTicket));
    }

    /// Cells of one (page, layer) each; the transfer completes iff all 9 are sent.
    fn cell(t: &Ticket, i: u32) -> Frame {
        let (page, layer) = (i / 3, i % 3);
        kv(t, 0, page, layer..layer + 1, page * 4..(page * 4 + 4).min(10))
    }

    proptest! {
        #[test]
        fn completes_exactly_when_every_reserved_slot_is_covered(
            order in Just((0u32..9).collect::<Vec<_>>()).prop_shuffle(),
            keep in proptest::collection::vec(any::<bool>(), 9),
        ) {
            let sent: Vec<u32> = order.into_iter().filter(|i| keep[*i as usize]).collect();
            let mut frames: Vec<Frame> = sent.iter().map(|i| cell(&ticket(), *i)).collect();
            frames.push(close(&ticket(), 0, &prompt()));
            let frames = renumber(frames);
            let missing: u64 = (0u32..9).filter(|i| !sent.contains(i)).map(|i| if i / 3 == 2 { 2 } else { 4 }).sum();
            match run(&frames) {
                Ok(done) => {
                    prop_assert_eq!((missing, done.frames() as usize), (0, sent.len()));
                }
                Err(e) => {
                    prop_assert_eq!(e, WireError::Incomplete { missing });
                }
            }
        }

        /// A sender holding the link's keys (a compromised or buggy prefill worker) can seal
        /// any frame: arbitrary edits of an honest stream's fields, sealed, go through the codec
        /// and the transfer without a panic, every accepted write stays inside the
        /// reservation, and the transfer completes only when every reserved slot was written
        /// exactly once.
        #[test]
        fn edited_and_resealed_streams_never_complete_short(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..6, any::<u32>()), 0..6),
            dropped in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut frames = honest_frames(&ticket());
            if let Some(d) = dropped {
                frames.remove(d.index(frames.len()));
            }
            for (i, field, v) in edits {
                let n = frames.len();
                let f = &mut frames[i.index(n)];
                match (&mut f.body, field) {
                    (_, 0) => f.seq = v % 16,
                    (FrameBody::Kv(k), 1) => k.page_index = v % 6,
                    (FrameBody::Kv(k), 2) => k.layers = (v % 4)..(v % 4 + 1 + v % 3),
                    (FrameBody::Kv(k), 3) => k.tokens = (v % 12)..(v % 12 + 1 + v % 5),
                    (FrameBody::Kv(k), 4) => k.payload.truncate(v as usize % (k.payload.len() + 1)),
                    (FrameBody::Close(c), _) => c.tokens = v % 12,
                    _ => {}
                }
            }
            let (mut s, mut o) = link();
            let mut t = start();
            let mut seen = std::collections::HashSet::new();
            for f in &frames {
                // Our sealer refuses a sequence number not past the last; a rogue one might not,
                // and the transfer checks order itself.
                let Ok(bytes) = s.seal(f) else { continue };
                let Ok(f) = o.open_owned(&bytes, &tickets()) else { break };
                match t.receive(&f) {
                    Ok(Received::Written(next, w)) => {
                        for l in w.layers.clone() {
                            for s in w.slots.clone() {
                                prop_assert!(w.page_index * 4 + s < 10 && l < 3);
                                prop_assert!(seen.insert((l, w.page_index * 4 + s)));
                            }
                        }
                        prop_assert_eq!(w.payload.len() as u64, GEOM.payload_len(w.layers.len() as u32, w.slots.len() as u32).unwrap_or(0));
                        t = next;
                    }
                    Ok(Received::Complete(_)) => { prop_assert_eq!(seen.len(), 30); break; }
                    Err(_) => break,
                }
            }
        }

        #[test]
        fn arbitrary_frames_never_panic_and_never_double_cover(
            specs in proptest::collection::vec((0u32..6, 0u32..5, 1u32..4, 0u32..14, 1u32..6, any::<bool>()), 0..20),
        ) {
            let mut t = start();
            let mut seen = std::collections::HashSet::new();
            for (i, (page, l0, ln, t0, tn, close_now)) in specs.into_iter().enumerate() {
                let f = if close_now {
                    Frame::close(ticket().id(), i as u32, CloseFrame { tokens: 10, prompt_digest: crate::PromptDigest::of(&prompt()), first_token: 1 })
                } else {
                    kv(&ticket(), i as u32, page, l0..l0 + ln, t0..t0 + tn)
                };
                match t.receive(&f) {
                    Ok(Received::Written(next, w)) => {
                        for l in w.layers.clone() {
                            for s in w.slots.clone() {
                                prop_assert!(seen.insert((l, w.page_index * 4 + s)));
                                prop_assert!(w.page_index * 4 + s < 10 && l < 3);
                            }
                        }
                        t = next;
                    }
                    Ok(Received::Complete(_)) => { prop_assert_eq!(seen.len(), 30); break; }
                    Err(_) => break,
                }
            }
        }
    }
}
