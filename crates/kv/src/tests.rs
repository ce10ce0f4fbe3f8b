//! Behavioural unit tests of the pool, block tables and views.

use super::*;

fn layout(dtype: KvDtype, page_size: usize) -> KvLayout {
    KvLayout { n_layers: 3, n_kv_heads: 2, head_dim: 4, page_size, dtype }
}

fn pool_with(dtype: KvDtype, page_size: usize, pages: usize, scrub: ScrubPolicy) -> KvPool {
    let cfg = PoolConfig { layout: layout(dtype, page_size), capacity: Capacity::Tokens(pages * page_size), scrub };
    match KvPool::new(cfg) {
        Ok(p) => p,
        Err(e) => panic!("pool: {e}"),
    }
}

fn pool(pages: usize) -> KvPool {
    pool_with(KvDtype::F16, 4, pages, ScrubPolicy::OnFree)
}

fn owner(t: u64, r: u64) -> Owner {
    Owner { tenant: TenantId(t), request: RequestId(r) }
}

/// Values exact in f16, non-zero, distinct per owner / layer / position / element.
fn row(o: Owner, layer: usize, pos: usize, is_v: bool) -> Vec<f32> {
    (0..8)
        .map(|i| {
            let x = (o.tenant.0 * 97 + o.request.0 * 31 + layer as u64 * 13 + pos as u64 * 7 + i) % 1000;
            x as f32 + 1.0 + if is_v { 0.5 } else { 0.0 }
        })
        .collect()
}

fn fill(t: &mut BlockTable, len: usize) {
    let o = t.owner();
    for layer in 0..3 {
        for pos in 0..len {
            t.write(layer, pos, &row(o, layer, pos, false), &row(o, layer, pos, true)).expect("write");
        }
    }
}

fn read(t: &BlockTable, layer: usize, pos: usize) -> Result<(Vec<f32>, Vec<f32>), KvError> {
    let (mut k, mut v) = (vec![0.0; 8], vec![0.0; 8]);
    t.read(layer, pos, &mut k, &mut v).map(|_| (k, v))
}

#[test]
fn invalid_configs_are_rejected_with_typed_errors_naming_the_numbers() {
    let mut l = layout(KvDtype::F16, 0);
    let cfg = |l: KvLayout, capacity| PoolConfig { layout: l, capacity, scrub: ScrubPolicy::OnFree };
    let e = KvPool::new(cfg(l, Capacity::Tokens(64))).expect_err("page_size 0");
    assert!(matches!(e, KvError::InvalidConfig { field: "page_size", .. }), "{e}");
    l.page_size = 16;
    l.head_dim = 0;
    let e = KvPool::new(cfg(l, Capacity::Tokens(64))).expect_err("head_dim 0");
    assert!(matches!(e, KvError::InvalidConfig { field: "head_dim", .. }), "{e}");
    l.head_dim = 4;
    let e = KvPool::new(cfg(l, Capacity::Tokens(15))).expect_err("under one page");
    assert!(matches!(e, KvError::InvalidConfig { field: "capacity", .. }), "{e}");
    assert!(e.to_string().contains("15") && e.to_string().contains("16"), "{e}");
    let e = KvPool::new(cfg(l, Capacity::Bytes(0))).expect_err("zero bytes");
    assert!(e.to_string().contains(&l.page_bytes().to_string()), "{e}");
}

#[test]
fn capacity_rounds_down_to_whole_pages() {
    let l = layout(KvDtype::F32, 16);
    let p = KvPool::new(PoolConfig { layout: l, capacity: Capacity::Tokens(100), scrub: ScrubPolicy::OnFree })
        .expect("pool");
    assert_eq!((p.total_pages(), p.capacity_tokens()), (6, 96));
    let p = KvPool::new(PoolConfig {
        layout: l,
        capacity: Capacity::Bytes(3 * l.page_bytes() + 1),
        scrub: ScrubPolicy::OnAlloc,
    })
    .expect("pool");
    assert_eq!((p.total_pages(), p.free_pages(), p.used_pages()), (3, 3, 0));
    assert_eq!(p.layout(), &l);
}

#[test]
fn exhausted_pool_returns_typed_error_and_reserves_nothing() {
    let p = pool(4);
    let _a = p.reserve(owner(1, 1), 12).expect("3 pages");
    let e = p.reserve(owner(2, 1), 8).expect_err("needs 2, 1 free");
    assert_eq!(e, KvError::Exhausted { requested_pages: 2, free_pages: 1 });
    assert!(e.to_string().contains('2') && e.to_string().contains('1'));
    assert_eq!((p.free_pages(), p.pages_used_by(TenantId(2))), (1, 0));
}

#[test]
fn reservation_is_all_or_nothing() {
    let p = pool(5);
    let t = p.reserve(owner(1, 1), 9).expect("3 pages");
    assert_eq!((t.pages(), t.capacity()), (3, 12));
    assert!(p.reserve(owner(1, 2), 12).is_err());
    assert_eq!(p.free_pages(), 2);
    let u = p.reserve(owner(1, 2), 8).expect("exactly the rest");
    assert_eq!((p.free_pages(), p.used_pages(), p.pages_used_by(TenantId(1))), (0, 5, 5));
    drop((t, u));
    assert_eq!(p.free_pages(), 5);
}

#[test]
fn reserving_zero_tokens_gives_an_empty_table() {
    let p = pool(2);
    let t = p.reserve(owner(1, 1), 0).expect("empty");
    assert_eq!((t.pages(), t.capacity(), p.free_pages()), (0, 0, 2));
    assert_eq!(t.layer(0, 0).expect("empty view").chunks().count(), 0);
}

#[test]
fn check_fits_rejects_requests_larger_than_the_pool() {
    let p = pool(4);
    assert_eq!(p.check_fits(16), Ok(()));
    assert_eq!(p.check_fits(17), Err(KvError::ExceedsPool { requested_tokens: 17, capacity_tokens: 16 }));
}

#[test]
fn grow_adds_whole_pages_or_none() {
    let p = pool(4);
    let mut t = p.reserve(owner(1, 1), 3).expect("1 page");
    t.grow(4).expect("already fits");
    assert_eq!(t.pages(), 1);
    t.grow(5).expect("one more page");
    assert_eq!((t.pages(), t.capacity()), (2, 8));
    let before: Vec<_> = t.page_refs().collect();
    let e = t.grow(17).expect_err("needs 3 more, 2 free");
    assert_eq!(e, KvError::Exhausted { requested_pages: 3, free_pages: 2 });
    assert_eq!(t.page_refs().collect::<Vec<_>>(), before);
    assert_eq!(p.free_pages(), 2);
}

#[test]
fn grown_table_keeps_earlier_data() {
    let p = pool(4);
    let mut t = p.reserve(owner(3, 4), 4).expect("1 page");
    fill(&mut t, 4);
    t.grow(8).expect("grow");
    assert_eq!(read(&t, 2, 3).expect("kept"), (row(t.owner(), 2, 3, false), row(t.owner(), 2, 3, true)));
    assert!(matches!(read(&t, 0, 4), Err(KvError::Unwritten { layer: 0, pos: 4 })));
}

#[test]
fn unwritten_slot_cannot_be_read() {
    let p = pool(2);
    let mut t = p.reserve(owner(1, 1), 8).expect("2 pages");
    assert_eq!(read(&t, 0, 0), Err(KvError::Unwritten { layer: 0, pos: 0 }));
    assert!(matches!(t.layer(0, 1), Err(KvError::Unwritten { layer: 0, pos: 0 })));
    t.write(0, 0, &[1.0; 8], &[2.0; 8]).expect("write");
    assert!(read(&t, 0, 0).is_ok());
    assert!(t.is_written(0, 0) && !t.is_written(0, 1) && !t.is_written(1, 0));
    assert_eq!(read(&t, 0, 1), Err(KvError::Unwritten { layer: 0, pos: 1 }));
    assert_eq!(read(&t, 1, 0), Err(KvError::Unwritten { layer: 1, pos: 0 }));
    assert!(t.layer(0, 1).is_ok());
}

#[test]
fn layer_view_reports_the_first_unwritten_position_even_on_a_later_page() {
    let p = pool(3);
    let mut t = p.reserve(owner(1, 1), 12).expect("3 pages");
    fill(&mut t, 12);
    let mut u = p.reserve(owner(1, 2), 0).expect("empty");
    drop(t);
    u.grow(12).expect("all pages again");
    for pos in (0..12).filter(|&p| p != 6) {
        u.write(1, pos, &[1.0; 8], &[1.0; 8]).expect("write");
    }
    assert_eq!(u.layer(1, 6).map(|v| v.len()), Ok(6));
    assert!(matches!(u.layer(1, 7), Err(KvError::Unwritten { layer: 1, pos: 6 })));
    assert!(matches!(u.layer(1, 12), Err(KvError::Unwritten { layer: 1, pos: 6 })));
    assert!(matches!(u.verify_written(1), Err(KvError::Unwritten { layer: 0, pos: 0 })));
}

#[test]
fn f32_round_trip_is_exact() {
    let p = pool_with(KvDtype::F32, 4, 2, ScrubPolicy::OnFree);
    let mut t = p.reserve(owner(1, 1), 8).expect("reserve");
    let k: Vec<f32> = (0..8).map(|i| 0.1 + i as f32 * 1.234_567e-3).collect();
    let v: Vec<f32> = (0..8).map(|i| -3.3e7 + i as f32).collect();
    t.write(2, 5, &k, &v).expect("write");
    assert_eq!(read(&t, 2, 5).expect("read"), (k, v));
}

#[test]
fn f16_round_trip_rounds_to_half_precision() {
    let p = pool(2);
    let mut t = p.reserve(owner(1, 1), 8).expect("reserve");
    let k: Vec<f32> = (0..8).map(|i| 0.1 + i as f32 * 0.37).collect();
    let v: Vec<f32> = (0..8).map(|i| -(i as f32) * 1000.5).collect();
    t.write(1, 7, &k, &v).expect("write");
    let (rk, rv) = read(&t, 1, 7).expect("read");
    let half = |x: &f32| half::f16::from_f32(*x).to_f32();
    assert_eq!(rk, k.iter().map(half).collect::<Vec<_>>());
    assert_eq!(rv, v.iter().map(half).collect::<Vec<_>>());
    let view = t.layer(1, 8);
    assert!(view.is_err(), "other slots of layer 1 are unwritten");
}

#[test]
fn layer_view_chunks_follow_pages_and_match_writes() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let p = pool_with(dtype, 4, 3, ScrubPolicy::OnFree);
        let mut t = p.reserve(owner(5, 6), 10).expect("3 pages");
        fill(&mut t, 10);
        let view = t.layer(2, 10).expect("view");
        assert_eq!((view.len(), view.layer()), (10, 2));
        let chunks: Vec<_> = view.chunks().collect();
        assert_eq!(chunks.iter().map(|c| (c.start, c.len)).collect::<Vec<_>>(), [(0, 4), (4, 4), (8, 2)]);
        for c in chunks {
            assert_eq!((c.k_run(0).len(), c.v.len()), (c.len, c.len * 8));
            for s in 0..c.len {
                let mut got = vec![0.0; 8];
                for (i, g) in got.iter_mut().enumerate() {
                    *g = c.k_at(s, i);
                    assert_eq!(*g, c.k_run(i).get(s));
                }
                assert_eq!(got, row(t.owner(), 2, c.start + s, false));
            }
            let mut all_v = vec![0.0; c.len * 8];
            c.v.copy_to_f32(&mut all_v);
            let want: Vec<f32> = (0..c.len).flat_map(|s| row(t.owner(), 2, c.start + s, true)).collect();
            assert_eq!(all_v, want);
        }
    }
}

#[test]
fn write_range_spans_pages_like_single_writes() {
    let p = pool(4);
    let mut t = p.reserve(owner(1, 1), 16).expect("4 pages");
    let o = t.owner();
    let k: Vec<f32> = (3..13).flat_map(|pos| row(o, 1, pos, false)).collect();
    let v: Vec<f32> = (3..13).flat_map(|pos| row(o, 1, pos, true)).collect();
    t.write_range(1, 3, &k, &v).expect("write_range");
    for pos in 3..13 {
        assert_eq!(read(&t, 1, pos).expect("read"), (row(o, 1, pos, false), row(o, 1, pos, true)));
    }
    assert_eq!(read(&t, 1, 2), Err(KvError::Unwritten { layer: 1, pos: 2 }));
    assert_eq!(read(&t, 1, 13), Err(KvError::Unwritten { layer: 1, pos: 13 }));
}

#[test]
fn write_range_validates_before_writing_anything() {
    let p = pool(2);
    let mut t = p.reserve(owner(1, 1), 8).expect("2 pages");
    let e = t.write_range(0, 6, &[1.0; 24], &[1.0; 24]).expect_err("3 positions from 6 > 8");
    assert_eq!(e, KvError::BeyondCapacity { len: 9, capacity: 8 });
    assert!(!t.is_written(0, 6) && !t.is_written(0, 7));
    assert!(matches!(t.write_range(0, 0, &[1.0; 9], &[1.0; 9]), Err(KvError::LengthMismatch { .. })));
    assert!(matches!(t.write_range(0, 0, &[1.0; 8], &[1.0; 16]), Err(KvError::LengthMismatch { .. })));
    assert!(matches!(t.write_range(3, 0, &[1.0; 8], &[1.0; 8]), Err(KvError::OutOfRange { what: "layer", .. })));
}

#[test]
fn wrong_lengths_and_out_of_range_indices_are_rejected() {
    let p = pool(2);
    let mut t = p.reserve(owner(1, 1), 5).expect("2 pages");
    assert_eq!(t.write(0, 0, &[0.0; 7], &[0.0; 8]), Err(KvError::LengthMismatch { what: "k", expected: 8, got: 7 }));
    assert_eq!(t.write(0, 0, &[0.0; 8], &[0.0; 9]), Err(KvError::LengthMismatch { what: "v", expected: 8, got: 9 }));
    assert_eq!(t.write(3, 0, &[0.0; 8], &[0.0; 8]), Err(KvError::OutOfRange { what: "layer", index: 3, limit: 3 }));
    let e = t.write(0, 8, &[0.0; 8], &[0.0; 8]).expect_err("pos 8 of 8");
    assert_eq!(e, KvError::OutOfRange { what: "position", index: 8, limit: 8 });
    assert_eq!(e.to_string(), "position 8 is out of range (must be < 8)");
    assert!(matches!(t.layer(0, 9), Err(KvError::BeyondCapacity { len: 9, capacity: 8 })));
    let (mut k, mut v) = (vec![0.0; 8], vec![0.0; 3]);
    assert!(matches!(t.read(0, 0, &mut k, &mut v), Err(KvError::LengthMismatch { what: "v_out", .. })));
}

fn freed_page_is_zeroed_before_reuse(scrub: ScrubPolicy) {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let p = pool_with(dtype, 4, 2, scrub);
        let mut t = p.reserve(owner(1, 1), 8).expect("all pages");
        fill(&mut t, 8);
        assert!(!t.debug_pages_zeroed());
        drop(t);
        if scrub == ScrubPolicy::OnFree {
            assert!(p.debug_free_pages_zeroed());
        }
        let u = p.reserve(owner(2, 1), 8).expect("same pages again");
        assert!(u.debug_pages_zeroed(), "{scrub:?} {dtype:?}: new owner sees old bytes");
        assert_eq!(read(&u, 0, 0), Err(KvError::Unwritten { layer: 0, pos: 0 }));
        assert!(p.pages_scrubbed() >= 2);
    }
}

#[test]
fn freed_page_is_zeroed_before_reuse_on_free_policy() {
    freed_page_is_zeroed_before_reuse(ScrubPolicy::OnFree);
}

#[test]
fn freed_page_is_zeroed_before_reuse_on_alloc_policy() {
    freed_page_is_zeroed_before_reuse(ScrubPolicy::OnAlloc);
}

#[test]
fn each_allocation_bumps_the_page_generation() {
    let p = pool(1);
    let t = p.reserve(owner(1, 1), 1).expect("page");
    let first = t.page_refs().collect::<Vec<_>>();
    drop(t);
    let t = p.reserve(owner(2, 2), 1).expect("page");
    let second = t.page_refs().collect::<Vec<_>>();
    assert_eq!(first[0].page, second[0].page);
    assert_eq!(second[0].generation, first[0].generation + 1);
}

#[test]
fn stale_generation_is_detected_on_write_view_and_read() {
    let p = pool(2);
    let mut t = p.reserve(owner(1, 1), 8).expect("pages");
    fill(&mut t, 8);
    let r = t.page_refs().nth(1).expect("page 1");
    t.pool.tamper(r.page, r.generation + 1, t.owner());
    let stale = KvError::StaleGeneration { page: r.page, expected: r.generation, found: r.generation + 1 };
    assert_eq!(read(&t, 0, 5), Err(stale.clone()));
    assert!(matches!(t.layer(0, 8), Err(ref e) if *e == stale));
    assert!(t.layer(0, 4).is_ok(), "the untouched page is still fine");
    assert_eq!(t.write(0, 5, &[0.0; 8], &[0.0; 8]), Err(stale.clone()));
    assert_eq!(t.write_range(0, 2, &[0.0; 24], &[0.0; 24]), Err(stale));
    assert!(!t.is_written(0, 5));
    t.pool.tamper(r.page, r.generation, t.owner());
}

#[test]
fn wrong_owner_is_detected_on_write_view_and_read() {
    let p = pool(1);
    let mut t = p.reserve(owner(1, 1), 4).expect("page");
    fill(&mut t, 4);
    let r = t.page_refs().next().expect("page");
    t.pool.tamper(r.page, r.generation, owner(9, 9));
    let wrong = KvError::WrongOwner { page: r.page, expected: owner(1, 1), found: owner(9, 9) };
    assert_eq!(read(&t, 0, 0), Err(wrong.clone()));
    assert!(matches!(t.layer(0, 1), Err(ref e) if *e == wrong));
    assert_eq!(t.write(0, 0, &[0.0; 8], &[0.0; 8]), Err(wrong));
}

#[test]
fn dropping_tables_returns_pages_and_tenant_usage() {
    let p = pool(6);
    let a = p.reserve(owner(1, 1), 5).expect("2");
    let b = p.reserve(owner(1, 2), 4).expect("1");
    let c = p.reserve(owner(2, 1), 9).expect("3");
    assert_eq!((p.pages_used_by(TenantId(1)), p.pages_used_by(TenantId(2)), p.pages_used_by(TenantId(3))), (3, 3, 0));
    for r in a.page_refs().chain(b.page_refs()).chain(c.page_refs()) {
        assert!(p.debug_is_leased(r.page));
    }
    drop(a);
    assert_eq!((p.pages_used_by(TenantId(1)), p.used_pages()), (1, 4));
    drop((b, c));
    assert_eq!((p.pages_used_by(TenantId(1)), p.pages_used_by(TenantId(2)), p.free_pages()), (0, 0, 6));
}

#[test]
fn scrub_one_page_for_bench_zeroes_a_free_page_and_returns_it() {
    let p = pool_with(KvDtype::F16, 4, 1, ScrubPolicy::OnAlloc);
    let mut t = p.reserve(owner(1, 1), 4).expect("page");
    fill(&mut t, 4);
    assert!(!p.scrub_one_page_for_bench(), "no free page");
    drop(t);
    assert!(!p.debug_free_pages_zeroed(), "OnAlloc leaves freed pages dirty until reuse");
    assert!(p.scrub_one_page_for_bench());
    assert!(p.debug_free_pages_zeroed());
    assert_eq!(p.free_pages(), 1);
}

#[test]
fn page_size_over_64_tracks_written_slots_across_mask_words() {
    let p = pool_with(KvDtype::F32, 100, 2, ScrubPolicy::OnFree);
    let mut t = p.reserve(owner(1, 1), 200).expect("pages");
    let o = t.owner();
    let k: Vec<f32> = (0..170).flat_map(|pos| row(o, 0, pos, false)).collect();
    t.write_range(0, 0, &k, &k).expect("write");
    assert!(t.layer(0, 170).is_ok());
    assert!(matches!(t.layer(0, 171), Err(KvError::Unwritten { layer: 0, pos: 170 })));
    t.write(0, 199, &[1.0; 8], &[1.0; 8]).expect("write last");
    assert!(matches!(t.layer(0, 200), Err(KvError::Unwritten { layer: 0, pos: 170 })));
    assert_eq!(read(&t, 0, 127).expect("read").0, row(o, 0, 127, false));
}

#[test]
fn pool_is_send_sync_and_table_is_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<KvPool>();
    send::<BlockTable>();
    send::<PageLease>();
}

#[test]
fn concurrent_owners_on_threads_only_see_their_own_data() {
    let p = pool_with(KvDtype::F16, 4, 16, ScrubPolicy::OnFree);
    let threads: Vec<_> = (0..4u64)
        .map(|tenant| {
            let p = p.clone();
            std::thread::spawn(move || {
                for req in 0..50u64 {
                    let o = owner(tenant, req);
                    let Ok(mut t) = p.reserve(o, 8 + (req as usize % 8)) else {
                        continue;
                    };
                    let len = t.capacity();
                    fill(&mut t, len);
                    for layer in 0..3 {
                        let view = t.layer(layer, len).expect("all written");
                        for c in view.chunks() {
                            for s in 0..c.len {
                                let got: Vec<f32> = (0..8).map(|i| c.k_at(s, i)).collect();
                                assert_eq!(got, row(o, layer, c.start + s, false));
                            }
                        }
                    }
                    let moved =
                        std::thread::spawn(move || read(&t, 2, 0).map(|kv| kv.0)).join().expect("reader thread");
                    assert_eq!(moved, Ok(row(o, 2, 0, false)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(p.free_pages(), 16);
}

#[test]
fn chunk_k_runs_never_reach_a_pages_unwritten_tail() {
    let p = pool_with(KvDtype::F16, 4, 3, ScrubPolicy::OnFree);
    let mut t = p.reserve(owner(1, 1), 12).expect("3 pages");
    fill(&mut t, 10);
    let view = t.layer(0, 10).expect("view");
    let last = view.chunks().last().expect("a chunk");
    assert_eq!((last.start, last.len), (8, 2));
    for i in 0..8 {
        assert_eq!(last.k_run(i).len(), 2);
    }
    let out_of_chunk = std::panic::catch_unwind(|| last.k_at(2, 0));
    assert!(out_of_chunk.is_err(), "slot 10 was never written and must not be readable");
}

#[test]
fn exported_rows_import_bit_exactly_into_another_pool_and_mark_only_those_slots_written() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let (a, b) = (pool_with(dtype, 4, 4, ScrubPolicy::OnFree), pool_with(dtype, 4, 4, ScrubPolicy::OnFree));
        let mut src = a.reserve(owner(1, 1), 10).expect("reserve");
        fill(&mut src, 10);
        let mut dst = b.reserve(owner(2, 9), 10).expect("reserve");
        for layer in 0..3 {
            // Ranges that start and end inside pages.
            for (start, n) in [(0, 3), (3, 6), (9, 1)] {
                let mut bytes = Vec::new();
                src.export_rows(layer, start, n, &mut bytes).expect("export");
                assert_eq!(bytes.len(), 2 * n * 8 * dtype.bytes());
                dst.import_rows(layer, start, n, &bytes).expect("import");
            }
        }
        for layer in 0..3 {
            for pos in 0..10 {
                assert_eq!(read(&src, layer, pos).expect("src"), read(&dst, layer, pos).expect("dst"));
            }
        }
        assert!(!dst.is_written(0, 10), "slot 10 was never imported");
    }
}

#[test]
fn export_refuses_unwritten_slots_and_import_refuses_bad_lengths_writing_nothing() {
    let p = pool(4);
    let mut t = p.reserve(owner(1, 1), 8).expect("reserve");
    fill(&mut t, 5);
    let mut out = Vec::new();
    assert!(matches!(t.export_rows(0, 3, 3, &mut out), Err(KvError::Unwritten { layer: 0, pos: 5 })));
    let mut u = p.reserve(owner(1, 2), 8).expect("reserve");
    let short = vec![1u8; 2 * 2 * 8 * 2 - 1];
    assert!(matches!(u.import_rows(0, 0, 2, &short), Err(KvError::LengthMismatch { .. })));
    let beyond = vec![1u8; 2 * 2 * 8 * 2];
    assert!(matches!(u.import_rows(0, 7, 2, &beyond), Err(KvError::BeyondCapacity { .. })));
    assert!(matches!(u.import_rows(3, 0, 2, &beyond), Err(KvError::OutOfRange { .. })));
    assert!((0..8).all(|pos| !u.is_written(0, pos)));
    assert!(u.debug_pages_zeroed());
}

mod prefix;
