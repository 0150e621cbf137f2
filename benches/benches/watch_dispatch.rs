//! Dispatching one event to 10,000 watcher cursors, and the full fan-out to them.
//!
//! Measures, on a cache of 1,000 ServiceAccounts:
//! - `dispatch/no_watchers`: `apply` of one update with nobody watching (the baseline: ingest,
//!   state update, history push);
//! - `dispatch/10k_same_namespace`: the same `apply` with 10,000 watchers that all match it
//!   (each gets a queued position and a wake-up; their drains are outside the timing);
//! - `dispatch/10k_namespaces_one_matching`: 10,000 watchers in 10,000 namespaces, the event
//!   in one of them (shows dispatch is O(matching), not O(watchers));
//! - `fanout/10k_json`: `apply` plus every one of the 10,000 watchers draining its frame
//!   (one JSON encoding, 10,000 shared `Bytes`), i.e. the whole cost of one event.
//!
//! (Memory per watcher is measured by the `watch_memory` bench, which needs a counting
//! allocator that would slow these down.)
//!
//! Run: `cargo bench -p svc-benches --bench watch_dispatch`
//! (quick: `-- --warm-up-time 1 --measurement-time 3`).
//!
//! Last results (2-core shared VM, noisy; 2026-11-23):
//! - `dispatch/no_watchers`: 2.65 µs
//! - `dispatch/10k_same_namespace`: 354 µs (~35 ns per matching watcher)
//! - `dispatch/10k_namespaces_one_matching`: 3.1 µs (the baseline plus one watcher)
//! - `fanout/10k_json`: 1.26 ms (apply + 10,000 drains, one JSON encoding: ~125 ns per
//!   watcher, single-threaded)
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use svc_benches::{filled_cache, put};
use svc_core::watch::{
    FrameFormat, Selector, WatchCache, WatchCacheConfig, WatchRequest, WatchStart, Watcher,
};
use svc_storage::{FeedItem, Revision};

const WATCHERS: usize = 10_000;

fn watch(cache: &WatchCache, ns: &str) -> Watcher {
    let req = WatchRequest {
        namespace: Some(ns.into()),
        selector: Selector::everything(),
        start: WatchStart::Now,
        bookmarks: false,
        format: FrameFormat::Json,
    };
    cache
        .watch(req, Instant::now())
        .unwrap_or_else(|e| panic!("watch: {e}"))
}

fn drain_all(watchers: &mut [Watcher]) -> usize {
    let now = Instant::now();
    watchers
        .iter_mut()
        .map(|w| w.drain(1 << 20, now).frames.len())
        .sum()
}

/// Times `apply` of one fresh update in `ns` per iteration; `after` runs untimed after each.
fn time_applies(
    cache: &WatchCache,
    rev: &mut Revision,
    ns: &str,
    iters: u64,
    mut after: impl FnMut(u64) -> Duration,
) -> Duration {
    let mut total = Duration::ZERO;
    for k in 0..iters {
        *rev += 1;
        let ev = put(ns, "sa-0000001", *rev as u64, *rev);
        let start = Instant::now();
        cache.apply(FeedItem::Events(vec![ev]), start);
        total += start.elapsed();
        total += after(k);
    }
    total
}

fn bench_dispatch(c: &mut Criterion) {
    // Queues large enough that untimed drains every 32 events keep every watcher on the
    // fast path (queued positions, no fallback to walking the ring).
    let config = WatchCacheConfig {
        watcher_queue_limit: 1 << 12,
        ..WatchCacheConfig::default()
    };
    let mut group = c.benchmark_group("dispatch");

    let (alone, mut rev) = filled_cache(config.clone(), 1000, 10, Instant::now());
    group.bench_function("no_watchers", |b| {
        b.iter_custom(|iters| time_applies(&alone, &mut rev, "ns-0001", iters, |_| Duration::ZERO))
    });

    let (cache, mut rev) = filled_cache(config.clone(), 1000, 10, Instant::now());
    let mut same: Vec<Watcher> = (0..WATCHERS).map(|_| watch(&cache, "ns-0001")).collect();
    group.bench_function("10k_same_namespace", |b| {
        b.iter_custom(|iters| {
            let t = time_applies(&cache, &mut rev, "ns-0001", iters, |k| {
                if k % 32 == 31 {
                    drain_all(&mut same);
                }
                Duration::ZERO
            });
            drain_all(&mut same);
            t
        })
    });

    let (spread_cache, mut spread_rev) = filled_cache(config.clone(), 1000, 10, Instant::now());
    let mut spread: Vec<Watcher> = (0..WATCHERS)
        .map(|i| watch(&spread_cache, &format!("ns-{i:04}")))
        .collect();
    group.bench_function("10k_namespaces_one_matching", |b| {
        b.iter_custom(|iters| {
            time_applies(&spread_cache, &mut spread_rev, "ns-0001", iters, |_| {
                spread[1].drain(1 << 20, Instant::now());
                Duration::ZERO
            })
        })
    });
    group.finish();

    let mut group = c.benchmark_group("fanout");
    group.bench_function("10k_json", |b| {
        b.iter_custom(|iters| {
            time_applies(&cache, &mut rev, "ns-0001", iters, |_| {
                let start = Instant::now();
                let frames = drain_all(&mut same);
                debug_assert_eq!(frames, WATCHERS);
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench_dispatch);
criterion_main!(benches);
