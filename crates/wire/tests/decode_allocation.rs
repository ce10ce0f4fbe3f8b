//! Decoding arbitrary bytes never allocates more than the bytes given (the borrowed decode
//! nothing at all): no length field, however large, is trusted before it is checked against
//! what remains.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use wire::{decode, Codec, HandshakeMsg, TicketKey, TicketNonce};

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

fn any_key(_: &TicketNonce) -> Option<TicketKey> {
    Some(TicketKey::from_bytes([3; 32]))
}

/// A header claiming `len` bytes, then `rest`.
fn claiming(len: u32, rest: &[u8]) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(b"PWKV");
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(rest);
    v
}

#[test]
fn huge_length_fields_allocate_nothing() {
    for len in [u32::MAX, 1 << 30, 16 << 20, 1 << 20] {
        let bytes = claiming(len, &[1; 64]);
        let (largest, _) = measure(|| decode(&bytes, &any_key));
        assert_eq!(largest, 0, "len {len}");
        let (largest, _) = measure(|| HandshakeMsg::decode(&bytes));
        assert_eq!(largest, 0, "handshake len {len}");
    }
    let prefix = claiming(1 << 20, &[]);
    let (largest, _) = measure(|| Codec::new(64).frame_len(&prefix));
    assert_eq!(largest, 0);
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_allocates_at_most_their_length(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let (_, total) = measure(|| decode(&bytes, &any_key));
        prop_assert!(total <= bytes.len(), "allocated {} for {} bytes", total, bytes.len());
        let (_, total) = measure(|| Codec::default().decode_borrowed(&bytes, &any_key));
        prop_assert_eq!(total, 0);
        let (_, total) = measure(|| HandshakeMsg::decode(&bytes));
        prop_assert_eq!(total, 0);
    }

    #[test]
    fn decoding_a_valid_frame_allocates_at_most_its_length(
        payload in proptest::collection::vec(any::<u8>(), 0..4096),
        seq in any::<u32>(), page in any::<u32>(),
    ) {
        let ticket = wire::TicketId { nonce: TicketNonce([0; 16]), request: wire::RequestId(1), tenant: wire::TenantId(2) };
        let frame = wire::Frame::kv(ticket, seq, wire::KvFrame { page_index: page, layers: 0..1, tokens: 0..1, payload });
        let bytes = wire::encode(&frame, &TicketKey::from_bytes([3; 32])).unwrap_or_default();
        let (_, total) = measure(|| decode(&bytes, &any_key));
        prop_assert!(total <= bytes.len());
        let (_, total) = measure(|| Codec::default().decode_borrowed(&bytes, &any_key));
        prop_assert_eq!(total, 0, "the borrowed decode allocates nothing");
        prop_assert_eq!(decode(&bytes, &any_key), Ok(frame));
    }
}
