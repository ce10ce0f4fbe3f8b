//! Property tests: random interleavings of reserve / grow / write / read / view / drop by many
//! owners never let one owner see another's data or an unwritten slot, never put a page in two
//! live tables, keep the accounting exact, and leave the pool full and zeroed at the end.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::{HashMap, HashSet};

use kv::*;
use proptest::prelude::*;

const ROW: usize = 4; // n_kv_heads 1 x head_dim 4
const LAYERS: usize = 2;
const POOL_PAGES: usize = 8;

fn new_pool(dtype: KvDtype, page_size: usize, scrub: ScrubPolicy) -> KvPool {
    let layout = KvLayout { n_layers: LAYERS, n_kv_heads: 1, head_dim: ROW, page_size, dtype };
    KvPool::new(PoolConfig { layout, capacity: Capacity::Tokens(POOL_PAGES * page_size), scrub }).expect("pool")
}

/// Owner- and position-derived values, non-zero and exact in f16.
fn row(o: Owner, layer: usize, pos: usize, is_v: bool) -> Vec<f32> {
    (0..ROW as u64)
        .map(|i| {
            let x = (o.tenant.0 * 131 + o.request.0 * 37 + layer as u64 * 11 + pos as u64 * 5 + i) % 1000;
            x as f32 + 1.0 + if is_v { 0.5 } else { 0.0 }
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Reserve { tenant: u64, tokens: usize },
    Grow { slot: usize, tokens: usize },
    Write { slot: usize, layer: usize, pos: usize },
    WriteRange { slot: usize, layer: usize, start: usize, n: usize },
    Read { slot: usize, layer: usize, pos: usize },
    View { slot: usize, layer: usize, len: usize },
    Drop { slot: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let s = any::<usize>();
    prop_oneof![
        2 => (0..4u64, 0..20usize).prop_map(|(tenant, tokens)| Op::Reserve { tenant, tokens }),
        1 => (s, 0..28usize).prop_map(|(slot, tokens)| Op::Grow { slot, tokens }),
        4 => (s, 0..LAYERS + 1, 0..28usize).prop_map(|(slot, layer, pos)| Op::Write { slot, layer, pos }),
        2 => (s, 0..LAYERS, 0..24usize, 0..10usize)
            .prop_map(|(slot, layer, start, n)| Op::WriteRange { slot, layer, start, n }),
        3 => (s, 0..LAYERS, 0..28usize).prop_map(|(slot, layer, pos)| Op::Read { slot, layer, pos }),
        2 => (s, 0..LAYERS, 0..28usize).prop_map(|(slot, layer, len)| Op::View { slot, layer, len }),
        1 => s.prop_map(|slot| Op::Drop { slot }),
    ]
}

fn config() -> impl Strategy<Value = (KvDtype, usize, ScrubPolicy)> {
    (
        prop_oneof![Just(KvDtype::F16), Just(KvDtype::F32)],
        prop_oneof![Just(1usize), Just(3), Just(4), Just(8)],
        prop_oneof![Just(ScrubPolicy::OnFree), Just(ScrubPolicy::OnAlloc)],
    )
}

struct Live {
    table: BlockTable,
    written: HashSet<(usize, usize)>,
}

fn write_one(l: &mut Live, layer: usize, pos: usize) -> Result<(), KvError> {
    let o = l.table.owner();
    l.table.write(layer, pos, &row(o, layer, pos, false), &row(o, layer, pos, true))
}

fn check_accounting(pool: &KvPool, live: &[Live]) {
    let mut seen = HashSet::new();
    let mut by_tenant: HashMap<TenantId, usize> = HashMap::new();
    for l in live {
        assert_eq!(l.table.capacity(), l.table.pages() * pool.layout().page_size);
        for r in l.table.page_refs() {
            assert!(seen.insert(r.page), "page {} in two live tables", r.page);
            assert!(pool.debug_is_leased(r.page));
        }
        *by_tenant.entry(l.table.owner().tenant).or_default() += l.table.pages();
    }
    assert_eq!(pool.used_pages(), seen.len());
    assert_eq!(pool.free_pages() + pool.used_pages(), pool.total_pages());
    for t in 0..4 {
        let t = TenantId(t);
        assert_eq!(pool.pages_used_by(t), by_tenant.get(&t).copied().unwrap_or(0));
    }
}

fn check_read(l: &Live, layer: usize, pos: usize) {
    let (mut k, mut v) = (vec![0.0; ROW], vec![0.0; ROW]);
    let got = l.table.read(layer, pos, &mut k, &mut v);
    if pos >= l.table.capacity() {
        assert!(matches!(got, Err(KvError::OutOfRange { what: "position", .. })), "{got:?}");
    } else if l.written.contains(&(layer, pos)) {
        assert_eq!(got, Ok(()));
        let o = l.table.owner();
        assert_eq!((k, v), (row(o, layer, pos, false), row(o, layer, pos, true)));
    } else {
        assert_eq!(got, Err(KvError::Unwritten { layer, pos }));
    }
}

fn check_view(l: &Live, layer: usize, len: usize) {
    let got = l.table.layer(layer, len);
    if len > l.table.capacity() {
        assert!(matches!(got, Err(KvError::BeyondCapacity { .. })));
        return;
    }
    if let Some(pos) = (0..len).find(|&p| !l.written.contains(&(layer, p))) {
        assert!(matches!(got, Err(KvError::Unwritten { layer: a, pos: b }) if a == layer && b == pos));
        return;
    }
    let view = got.expect("fully written prefix");
    let o = l.table.owner();
    let mut next = 0;
    for c in view.chunks() {
        assert_eq!(c.start, next);
        let (mut k, mut v) = (vec![0.0; c.len * ROW], vec![0.0; c.len * ROW]);
        for s in 0..c.len {
            for i in 0..ROW {
                k[s * ROW + i] = c.k_at(s, i);
            }
        }
        c.v.copy_to_f32(&mut v);
        for s in 0..c.len {
            assert_eq!(k[s * ROW..(s + 1) * ROW], row(o, layer, c.start + s, false)[..]);
            assert_eq!(v[s * ROW..(s + 1) * ROW], row(o, layer, c.start + s, true)[..]);
        }
        next += c.len;
    }
    assert_eq!(next, len);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn owners_only_ever_read_their_own_written_data(
        (dtype, page_size, scrub) in config(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let pool = new_pool(dtype, page_size, scrub);
        let mut live: Vec<Live> = Vec::new();
        let mut next_request = 0u64;
        for op in ops {
            let n = live.len();
            match op {
                Op::Reserve { tenant, tokens } => {
                    next_request += 1;
                    let o = Owner { tenant: TenantId(tenant), request: RequestId(next_request) };
                    let need = pool.layout().pages_for(tokens);
                    let free = pool.free_pages();
                    match pool.reserve(o, tokens) {
                        Ok(table) => {
                            prop_assert!(need <= free);
                            prop_assert_eq!(table.pages(), need);
                            prop_assert!(table.debug_pages_zeroed(), "new reservation sees old bytes");
                            live.push(Live { table, written: HashSet::new() });
                        }
                        Err(e) => {
                            prop_assert_eq!(e, KvError::Exhausted { requested_pages: need, free_pages: free });
                            prop_assert_eq!(pool.free_pages(), free);
                        }
                    }
                }
                Op::Grow { slot, tokens } if n > 0 => {
                    let l = &mut live[slot % n];
                    let before = l.table.pages();
                    let need = pool.layout().pages_for(tokens).saturating_sub(before);
                    let free = pool.free_pages();
                    match l.table.grow(tokens) {
                        Ok(()) => prop_assert_eq!(l.table.pages(), before + need),
                        Err(e) => {
                            prop_assert_eq!(e, KvError::Exhausted { requested_pages: need, free_pages: free });
                            prop_assert_eq!(l.table.pages(), before);
                        }
                    }
                    prop_assert!(l.table.capacity() >= tokens || l.table.pages() == before);
                }
                Op::Write { slot, layer, pos } if n > 0 => {
                    let l = &mut live[slot % n];
                    let got = write_one(l, layer, pos);
                    if layer >= LAYERS {
                        prop_assert!(matches!(got, Err(KvError::OutOfRange { what: "layer", .. })), "{:?}", got);
                    } else if pos >= l.table.capacity() {
                        prop_assert!(matches!(got, Err(KvError::OutOfRange { what: "position", .. })), "{:?}", got);
                    } else {
                        prop_assert_eq!(got, Ok(()));
                        l.written.insert((layer, pos));
                    }
                }
                Op::WriteRange { slot, layer, start, n: count } if n > 0 => {
                    let l = &mut live[slot % n];
                    let o = l.table.owner();
                    let k: Vec<f32> = (start..start + count).flat_map(|p| row(o, layer, p, false)).collect();
                    let v: Vec<f32> = (start..start + count).flat_map(|p| row(o, layer, p, true)).collect();
                    let got = l.table.write_range(layer, start, &k, &v);
                    if start + count > l.table.capacity() {
                        prop_assert!(matches!(got, Err(KvError::BeyondCapacity { .. })), "{:?}", got);
                    } else {
                        prop_assert_eq!(got, Ok(()));
                        l.written.extend((start..start + count).map(|p| (layer, p)));
                    }
                }
                Op::Read { slot, layer, pos } if n > 0 => check_read(&live[slot % n], layer, pos),
                Op::View { slot, layer, len } if n > 0 => check_view(&live[slot % n], layer, len),
                Op::Drop { slot } if n > 0 => {
                    live.swap_remove(slot % n);
                }
                _ => {}
            }
            check_accounting(&pool, &live);
        }
        // Every surviving table still reads back exactly its own data.
        for l in &live {
            for layer in 0..LAYERS {
                for pos in 0..l.table.capacity() {
                    check_read(l, layer, pos);
                }
            }
        }
        live.clear();
        prop_assert_eq!(pool.free_pages(), pool.total_pages());
        prop_assert_eq!(pool.used_pages(), 0);
        for t in 0..4 {
            prop_assert_eq!(pool.pages_used_by(TenantId(t)), 0);
        }
        if scrub == ScrubPolicy::OnFree {
            prop_assert!(pool.debug_free_pages_zeroed());
        }
    }

    #[test]
    fn freed_pages_come_back_zeroed_and_unwritten(
        (dtype, page_size, scrub) in config(),
        rounds in prop::collection::vec((1..4u64, 1..30usize, prop::collection::vec((0..LAYERS, 0..64usize), 0..40)), 1..8),
    ) {
        let pool = new_pool(dtype, page_size, scrub);
        for (i, (tenant, tokens, writes)) in rounds.into_iter().enumerate() {
            let o = Owner { tenant: TenantId(tenant), request: RequestId(i as u64) };
            let tokens = tokens.min(pool.capacity_tokens());
            let mut l = Live { table: pool.reserve(o, tokens).expect("pool is empty between rounds"), written: HashSet::new() };
            prop_assert!(l.table.debug_pages_zeroed());
            for layer in 0..LAYERS {
                for pos in 0..l.table.capacity() {
                    check_read(&l, layer, pos);
                }
            }
            for (layer, pos) in writes {
                let pos = pos % l.table.capacity();
                write_one(&mut l, layer, pos).expect("in range");
                l.written.insert((layer, pos));
            }
            for &(layer, pos) in &l.written {
                check_read(&l, layer, pos);
            }
            drop(l);
            if scrub == ScrubPolicy::OnFree {
                prop_assert!(pool.debug_free_pages_zeroed());
            }
        }
        // The whole pool, reserved at once, is zero and unwritten everywhere.
        let all = pool.reserve(Owner { tenant: TenantId(9), request: RequestId(9) }, pool.capacity_tokens()).expect("all");
        prop_assert!(all.debug_pages_zeroed());
        for layer in 0..LAYERS {
            prop_assert_eq!(all.layer(layer, 1).err(), Some(KvError::Unwritten { layer, pos: 0 }));
        }
    }
}
