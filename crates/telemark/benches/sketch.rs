//! Criterion version of `telemark bench-sketch`: each sketch vanilla and NitroSketch, the parts of
//! the SFCMon pipeline's per-packet work, and the pipeline against the exact table at 1 and
//! 10⁶ active flows. `cargo bench -p telemark --bench sketch`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use telemark_core::sketch::bloom::Bloom;
use telemark_core::sketch::countmin::CountMin;
use telemark_core::sketch::countsketch::CountSketch;
use telemark_core::sketch::iblt::Iblt;
use telemark_core::sketch::kary::Kary;
use telemark_core::sketch::nitro::Nitro;
use telemark_core::sketch::sfcmon::{ExactFlows, HhConfig, Sfcmon};
use telemark_core::sketch::univmon::UnivMon;
use telemark_core::sketch::{fast64, murmur3_32, Hasher, Hashing, KeyBytes, RowSketch};
use telemark_core::FlowKey;
use telemark_lab::bench::{scrambled_flow, uniform_bursts};

const POOL: usize = 65_536;

/// A pool of keys from uniform traffic over `flows` flows (in cache, replayed).
fn keys(flows: u64) -> Vec<FlowKey> {
    (0..POOL as u64).map(|i| scrambled_flow(i, flows)).collect()
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(POOL as u64));
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    g.sample_size(20);
    g
}

/// What one heavy packet costs, piece by piece.
fn parts(c: &mut Criterion) {
    let flows = keys(100_000);
    let ids: Vec<KeyBytes> = flows.iter().map(KeyBytes::flow_of).collect();
    let h = Hasher::default();
    let mut g = group(c, "parts");
    g.bench_function("flow_of", |b| {
        b.iter(|| {
            for k in &flows {
                black_box(KeyBytes::flow_of(black_box(k)));
            }
        })
    });
    g.bench_function("source_of", |b| {
        b.iter(|| {
            for k in &flows {
                black_box(KeyBytes::source_of(black_box(k)));
            }
        })
    });
    g.bench_function("murmur3_flow_id", |b| {
        b.iter(|| ids.iter().map(|k| murmur3_32(k.as_bytes(), 1)).fold(0, |a, x| a ^ x))
    });
    g.bench_function("fast64_flow_id", |b| {
        b.iter(|| ids.iter().map(|k| fast64(k.as_bytes(), 1)).fold(0, |a, x| a ^ x))
    });
    for (name, h) in [("murmur3", h), ("fast", Hasher::new(Hashing::Fast, 1))] {
        let mut cms = CountMin::new(4, 4000, h).conservative(true);
        g.bench_function(format!("countmin_4x4000_cu/{name}"), |b| {
            b.iter(|| {
                ids.iter().map(|k| cms.update_estimate(k.as_bytes(), 1)).fold(0, |a, x| a ^ x)
            })
        });
        let mut cms = CountMin::new(4, 4000, h);
        g.bench_function(format!("countmin_4x4000/{name}"), |b| {
            b.iter(|| {
                ids.iter().map(|k| cms.update_estimate(k.as_bytes(), 1)).fold(0, |a, x| a ^ x)
            })
        });
    }
    let mut bloom = Bloom::new(16_384, 4, h);
    g.bench_function("bloom_insert_k4", |b| {
        b.iter(|| ids.iter().filter(|k| bloom.insert(k.as_bytes())).count())
    });
    let mut iblt = Iblt::new(420, 3, h);
    g.bench_function("iblt_update_k3", |b| {
        b.iter(|| {
            for k in &ids {
                iblt.update(k, 1, 64);
            }
        })
    });
    g.finish();
}

/// Vanilla against NitroSketch (p = 0.01), 5 rows as the NitroSketch paper.
fn sketches(c: &mut Criterion) {
    let ids: Vec<KeyBytes> = keys(100_000).iter().map(KeyBytes::flow_of).collect();
    let h = Hasher::default();
    let mut g = group(c, "sketch");
    fn pair<S: RowSketch + Clone>(
        g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        s: S,
        ids: &[KeyBytes],
    ) {
        let mut v = s.clone();
        g.bench_function(format!("{name}/vanilla"), |b| {
            b.iter(|| {
                for k in ids {
                    v.update(k.as_bytes(), 1);
                }
            })
        });
        let mut n = Nitro::new(s, 0.01, false, 0, 1);
        g.bench_function(format!("{name}/nitro"), |b| {
            b.iter(|| {
                for k in ids {
                    n.update(k);
                }
            })
        });
        black_box((&v, &n.sketch));
    }
    pair(&mut g, "countmin", CountMin::new(5, 5436, h), &ids);
    pair(&mut g, "countsketch", CountSketch::new(5, 5436, h), &ids);
    pair(&mut g, "kary", Kary::new(5, 5436, h), &ids);
    let mut v = UnivMon::new(16, 5, 2048, 100, h);
    g.bench_function("univmon/vanilla", |b| {
        b.iter(|| {
            for k in &ids {
                v.update(k);
            }
        })
    });
    let mut n = UnivMon::new(16, 5, 2048, 100, h).nitro(0.01, false, 1);
    g.bench_function("univmon/nitro", |b| {
        b.iter(|| {
            for k in &ids {
                n.update(k);
            }
        })
    });
    g.finish();
}

/// The SFCMon pipeline and the exact table on uniform traffic over 1 and 10⁶ flows, keys made
/// a burst at a time as `telemark bench-sketch` makes them (so the 10⁶ flows really are in the
/// table).
fn pipeline(c: &mut Criterion) {
    for flows in [1u64, 1_000_000] {
        let mut g = group(c, &format!("pipeline/{flows}_flows"));
        let mut s = Sfcmon::new(HhConfig::default());
        let mut e = ExactFlows::default();
        let mut next = 0u64;
        // Warm-up: every flow in the table once.
        for i in 0..flows.max(POOL as u64) {
            e.observe(&scrambled_flow(i, flows), 64);
        }
        g.bench_function("sfcmon", |b| {
            b.iter(|| {
                uniform_bursts(next, POOL as u64, flows, |key| s.observe(key, 64));
                next += POOL as u64;
            })
        });
        g.bench_function("exact", |b| {
            b.iter(|| {
                uniform_bursts(next, POOL as u64, flows, |key| e.observe(key, 64));
                next += POOL as u64;
            })
        });
        black_box((s.end_window(), e.packets()));
        g.finish();
    }
}

criterion_group!(benches, parts, sketches, pipeline);
criterion_main!(benches);
