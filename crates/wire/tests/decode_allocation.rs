//! Decoding arbitrary bytes never allocates more than the bytes given (the borrowed decode
//! nothing at all): no length field, however large, is trusted before it is checked against
//! what remains.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use wire::{HandshakeMsg, KvFrameMut, KvOpener, KvSealer, SessionKeys, TicketNonce, DEFAULT_MAX_FRAME, HEADER_LEN};

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        let _ = TOTAL.try_with(|t| t.set(t.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// (largest single allocation, total bytes allocated) while running `f` on this thread.
fn measure<T>(f: impl FnOnce() -> T) -> (usize, usize) {
    LARGEST.with(|l| l.set(0));
    TOTAL.with(|t| t.set(0));
    let out = f();
    let r = (LARGEST.with(Cell::get), TOTAL.with(Cell::get));
    drop(out);
    r
}

fn any_ticket(_: &TicketNonce) -> bool {
    true
}

fn session(initiator: bool) -> SessionKeys {
    SessionKeys::from_split(initiator, &[1; 32], &[2; 32], b"h")
}

fn opener() -> KvOpener {
    KvOpener::new(session(false), DEFAULT_MAX_FRAME).unwrap_or_else(|e| panic!("{e}"))
}

/// A frame claiming `len` bytes, then `rest`.
fn claiming(len: u32, rest: &[u8]) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(rest);
    v
}

#[test]
fn huge_length_fields_allocate_nothing() {
    for len in [u32::MAX, 1 << 30, 16 << 20, 1 << 20] {
        let mut bytes = claiming(len, &[1; 64]);
        let mut o = opener();
        let (largest, _) = measure(|| o.open(&mut bytes, &any_ticket).is_err());
        assert_eq!(largest, 0, "len {len}");
        let mut hs = claiming(len, b"PWHS");
        hs.extend_from_slice(&[2, 0, 1]);
        let (largest, _) = measure(|| HandshakeMsg::decode(&hs));
        assert_eq!(largest, 0, "handshake len {len}");
    }
    let prefix = claiming(1 << 20, &[]);
    let small = KvOpener::new(session(false), 64).unwrap_or_else(|e| panic!("{e}"));
    let (largest, _) = measure(|| small.frame_len(&prefix));
    assert_eq!(largest, 0);
}

#[test]
fn opening_a_header_that_claims_a_large_frame_allocates_nothing() {
    // Forged: refused, nothing allocated.
    let mut forged = [0x5a; HEADER_LEN];
    forged[..4].copy_from_slice(&((DEFAULT_MAX_FRAME - 4) as u32).to_le_bytes());
    let mut o = opener();
    let (largest, _) = measure(|| o.open_header(&mut forged, &any_ticket).is_err());
    assert_eq!(largest, 0);
    // Authentic: the length a stream reader then makes room for is one the link key vouched for.
    let ticket = wire::TicketId { nonce: TicketNonce([0; 16]), request: wire::RequestId(1), tenant: wire::TenantId(2) };
    let mut payload = vec![7u8; 1 << 20];
    let mut sealer = KvSealer::new(session(true), DEFAULT_MAX_FRAME).unwrap_or_else(|e| panic!("{e}"));
    let kv = KvFrameMut { page_index: 0, layers: 0..1, tokens: 0..1, payload: &mut payload };
    let mut head = sealer.seal_kv(&ticket, 0, kv).unwrap_or_else(|e| panic!("{e}")).head;
    let mut o = opener();
    let mut rest_len = 0;
    let (largest, _) = measure(|| rest_len = o.open_header(&mut head, &any_ticket).map_or(0, |h| h.rest_len()));
    assert_eq!(largest, 0);
    assert_eq!(rest_len, (1 << 20) + wire::AEAD_TAG_LEN);
}

proptest! {
    #[test]
    fn opening_arbitrary_bytes_allocates_nothing(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut o = opener();
        let mut b = bytes.clone();
        let (_, total) = measure(|| o.open(&mut b, &any_ticket).is_err());
        prop_assert_eq!(total, 0);
        let (_, total) = measure(|| HandshakeMsg::decode(&bytes));
        prop_assert_eq!(total, 0);
    }

    #[test]
    fn opening_a_valid_frame_allocates_nothing(
        payload in proptest::collection::vec(any::<u8>(), 0..4096),
        seq in any::<u32>(), page in any::<u32>(),
    ) {
        let ticket = wire::TicketId { nonce: TicketNonce([0; 16]), request: wire::RequestId(1), tenant: wire::TenantId(2) };
        let frame = wire::Frame::kv(ticket, seq, wire::KvFrame { page_index: page, layers: 0..1, tokens: 0..1, payload });
        let mut sealer = KvSealer::new(session(true), DEFAULT_MAX_FRAME).unwrap_or_else(|e| panic!("{e}"));
        let mut bytes = sealer.seal(&frame).unwrap_or_default();
        let mut o = opener();
        let (_, total) = measure(|| o.open(&mut bytes, &any_ticket).map(|f| f.seq));
        prop_assert_eq!(total, 0, "opening allocates nothing");
        let mut again = sealer_and_open(&frame);
        prop_assert_eq!(again.take(), Some(frame));
    }
}

fn sealer_and_open(frame: &wire::Frame) -> Option<wire::Frame> {
    let mut sealer = KvSealer::new(session(true), DEFAULT_MAX_FRAME).ok()?;
    let bytes = sealer.seal(frame).ok()?;
    opener().open_owned(&bytes, &any_ticket).ok()
}
