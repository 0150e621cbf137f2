//! What recording a delivered frame in the watch metrics costs when two threads deliver at
//! once: `apiserver_watch_events_total` and `apiserver_watch_events_sizes` as the gateway keeps
//! them, striped by thread (`svc_gateway::observe::metrics::striped`), against the same four
//! atomic adds on shared counters, as they were kept before.
//!
//! Measures `watch_metrics/{shared,striped}/2_threads`: two threads each record 10,000 frames
//! of 600 bytes, one at a time (a drain of one event per watcher), at once. Throughput is in
//! frames.
//!
//! Run: `cargo bench -p svc-benches --bench watch_metrics`
//!
//! Results (2 shared cores, AMD EPYC KVM guest; 2026-11-27; criterion's median, three runs):
//! - `shared/2_threads`: 1.75, 0.78 and 1.76 ms (11-25 M frames/s);
//! - `striped/2_threads`: 0.215-0.217 ms (92-93 M frames/s): 3.6-8x less.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use svc_gateway::observe::metrics::WATCH_EVENT_SIZE_BUCKETS;
use svc_gateway::observe::metrics::striped::{SizeHistogram, StripedCounter};

const THREADS: usize = 2;
const FRAMES: usize = 10_000;
const SIZE: usize = 600;
/// The gateway's buckets for `apiserver_watch_events_sizes` (kube-apiserver's).
static BOUNDS: [f64; 8] = WATCH_EVENT_SIZE_BUCKETS;

/// The metrics as they were: one counter, and a histogram's buckets, count and sum, each one
/// atomic every thread adds to.
#[derive(Default)]
struct Shared {
    events: AtomicU64,
    buckets: [AtomicU64; 9],
    count: AtomicU64,
    sum: AtomicU64,
}

impl Shared {
    fn record(&self, size: usize) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let i = BOUNDS.partition_point(|b| *b < size as f64);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(size as u64, Ordering::Relaxed);
    }
}

/// The metrics as the gateway keeps them now.
struct Striped {
    events: StripedCounter,
    sizes: SizeHistogram,
}

impl Striped {
    fn record(&self, size: usize) {
        self.events.inc_by(1);
        self.sizes.observe_all(std::iter::once(size));
    }
}

/// Times rounds in which `THREADS` threads each run `work` once, all at the same time.
fn time_rounds(iters: u64, work: Arc<dyn Fn() + Send + Sync>) -> Duration {
    let start = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (start, done, stop, work) =
                (start.clone(), done.clone(), stop.clone(), work.clone());
            std::thread::spawn(move || {
                loop {
                    start.wait();
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    work();
                    done.wait();
                }
            })
        })
        .collect();
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let t = Instant::now();
        start.wait();
        done.wait();
        total += t.elapsed();
    }
    stop.store(true, Ordering::Release);
    start.wait();
    for t in threads {
        t.join().unwrap();
    }
    total
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("watch_metrics");
    g.throughput(Throughput::Elements((THREADS * FRAMES) as u64));
    g.measurement_time(Duration::from_secs(3));

    let shared = Arc::new(Shared::default());
    let s = shared.clone();
    let work: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        for _ in 0..FRAMES {
            s.record(SIZE);
        }
    });
    g.bench_function(BenchmarkId::new("shared", "2_threads"), |b| {
        b.iter_custom(|iters| time_rounds(iters, work.clone()))
    });
    let n = shared.events.load(Ordering::Relaxed);
    assert!(n > 0 && n.is_multiple_of((THREADS * FRAMES) as u64), "{n}");

    let striped = Arc::new(Striped {
        events: StripedCounter::default(),
        sizes: SizeHistogram::new(&BOUNDS),
    });
    let s = striped.clone();
    let work: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        for _ in 0..FRAMES {
            s.record(SIZE);
        }
    });
    g.bench_function(BenchmarkId::new("striped", "2_threads"), |b| {
        b.iter_custom(|iters| time_rounds(iters, work.clone()))
    });
    let n = striped.events.get();
    assert!(n > 0 && n.is_multiple_of((THREADS * FRAMES) as u64), "{n}");
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
