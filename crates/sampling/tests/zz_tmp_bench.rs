use std::time::Instant;
#[test]
fn bench() {
    let mut r = sampling::Rng::seed_from_u64(1);
    let l: Vec<f32> = (0..49152).map(|_| (r.next_f64() * 20.0 - 10.0) as f32).collect();
    let t = Instant::now();
    let mut acc = 0.0;
    for _ in 0..100 { acc += sampling::logsumexp(&l); }
    eprintln!("lse {:?} {acc}", t.elapsed() / 100);
    let t = Instant::now();
    let mut acc = 0.0f32;
    for _ in 0..100 { let m = 10.0f32; acc += l.iter().map(|x| (x - m).exp()).sum::<f32>(); }
    eprintln!("f32 exp {:?} {acc}", t.elapsed() / 100);
    let t = Instant::now();
    for _ in 0..100 { let mut c: Vec<(f32,u32)> = l.iter().enumerate().map(|(i,&x)| (x, i as u32)).collect();
      c.select_nth_unstable_by(39, |a,b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1))); acc += c[0].0; }
    eprintln!("select {:?} {acc}", t.elapsed() / 100);
    let t = Instant::now();
    for _ in 0..100 { acc += sampling::argmax(&l) as f32; }
    eprintln!("argmax {:?} {acc}", t.elapsed() / 100);
}
