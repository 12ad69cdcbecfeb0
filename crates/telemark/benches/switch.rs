//! Criterion version of `telemark bench`: ns per packet of the switch pipeline with
//! `no_action`, `dec_ttl` and the loss check, for 1,024 and 65,536 flows of 64-byte frames.
//! `cargo bench -p telemark --bench switch`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;
use telemark_lab::bench::{Case, Variant, POOL};

fn switch(c: &mut Criterion) {
    for flows in [1024usize, 65536] {
        let mut g = c.benchmark_group(format!("switch/{flows}_flows/64B"));
        g.throughput(Throughput::Elements(POOL.max(flows) as u64));
        g.measurement_time(Duration::from_secs(3));
        g.sample_size(20);
        for v in Variant::ALL {
            // Flows warmed to steady state once; each sample times a fresh copy.
            let warmed = Case::new(v, flows, 64, 42);
            let mut seed = 42;
            g.bench_function(v.name(), |b| {
                b.iter_custom(|iters| {
                    // A fresh copy per sample: where one instance's packets and tables land in
                    // memory moves it by up to 22 % (docs/overhead.md), so the samples span
                    // many layouts instead of repeating one.
                    seed += 1;
                    let mut case = warmed.fork(seed);
                    case.pass();
                    // Time only the switch: each pass re-colors and re-TTLs its pool untimed.
                    (0..iters).map(|_| Duration::from_nanos(case.pass().1)).sum()
                })
            });
        }
        g.finish();
    }
}

/// The loss check alone: one observation of a known flow, in cache (4 flows, B = 100).
fn observe(c: &mut Criterion) {
    use telemark_core::loss::{BatchEvent, ColorTable, LossConfig};
    use telemark_core::{flow_hash, FlowKey};
    let cfg = LossConfig { table_size: 8, ..LossConfig::default() };
    let keys: Vec<FlowKey> =
        (0..4u16).map(|i| FlowKey { sport: i, ..FlowKey::default() }).collect();
    let hashes: Vec<u64> = keys.iter().map(flow_hash).collect();
    let mut t = ColorTable::<u8>::new(&cfg, 0);
    let mut ev: Vec<BatchEvent> = Vec::new();
    let mut sent = [0u64; 4];
    let mut now = 0u64;
    let mut g = c.benchmark_group("loss_check");
    g.throughput(Throughput::Elements(1));
    g.bench_function("observe_4_flows", |b| {
        b.iter(|| {
            now += 1;
            let f = (now % 4) as usize;
            let color = ((sent[f] / 100) & 1) as u8;
            sent[f] += 1;
            let r = t.observe(&keys[f], hashes[f], color, now, &mut ev);
            ev.clear();
            r
        })
    });
    g.finish();
}

criterion_group!(benches, switch, observe);
criterion_main!(benches);
