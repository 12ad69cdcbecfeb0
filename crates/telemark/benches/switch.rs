//! Criterion version of `telemark bench`: ns per packet of the switch pipeline with
//! `no_action`, `dec_ttl` and the loss check, for 1,024 and 65,536 flows of 64-byte frames.
//! `cargo bench -p telemark --bench switch`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;
use telemark_datapath::bench::{Case, Variant, POOL};

fn switch(c: &mut Criterion) {
    for flows in [1024usize, 65536] {
        let mut g = c.benchmark_group(format!("switch/{flows}_flows/64B"));
        g.throughput(Throughput::Elements(POOL.max(flows) as u64));
        g.measurement_time(Duration::from_secs(3));
        g.sample_size(20);
        for v in Variant::ALL {
            let mut case = Case::new(v, flows, 64, 42);
            case.pass();
            g.bench_function(v.name(), |b| {
                b.iter_custom(|iters| {
                    // Time only the switch: each pass re-colors and re-TTLs its pool untimed.
                    (0..iters).map(|_| Duration::from_nanos(case.pass().1)).sum()
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, switch);
criterion_main!(benches);
