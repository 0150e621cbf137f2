//! Dispatching one event to 10,000 watcher cursors, and the full fan-out to them.
//!
//! Measures, on a cache of 1,000 ServiceAccounts:
//! - `dispatch/no_watchers`: `apply` of one update with nobody watching (the baseline: ingest,
//!   state update, history push);
//! - `dispatch/10k_same_namespace`: the same `apply` with 10,000 watchers that all match it
//!   (each gets a queued position and a wake-up; their drains are outside the timing);
//! - `dispatch/10k_namespaces_one_matching`: 10,000 watchers in 10,000 namespaces, the event
//!   in one of them (shows dispatch is O(matching), not O(watchers));
//! - `dispatch/10k_pinned_nodes_one_matching`: 10,000 watchers of pods across namespaces,
//!   each pinned to its node (`spec.nodeName=node-N`, as kubelets watch through proxy mode's
//!   caches of run-time kinds), an update of a pod on one node: the field index visits one;
//! - `fanout/10k_json`: `apply` plus every one of the 10,000 watchers draining its frame
//!   (one JSON encoding, 10,000 shared `Bytes`), i.e. the whole cost of one event.
//! - `fanout/10k_json_2_threads`: the same, with two threads draining 5,000 watchers each at
//!   once, as two cores deliver one event.
//! - `wake/10k_direct` and `wake/10k_paced`: `apply` of one update to 10,000 watchers that
//!   are all waiting (a waker registered through `Watcher::ready`), with the gateway's wake
//!   gate in front (`paced`: 64 woken at once, the rest released slice by slice as the pacer
//!   task does, release included in the timing) or not (`direct`): what pacing adds;
//!   `wake/10k_paced_100_groups`: the same watchers in 100 wake groups (h2 connections),
//!   registered round-robin: what ordering the wake-ups by group adds.
//!
//! (Memory per watcher is measured by the `watch_memory` bench, which needs a counting
//! allocator that would slow these down.)
//!
//! Run: `cargo bench -p svc-benches --bench watch_dispatch`
//! (quick: `-- --warm-up-time 1 --measurement-time 3`).
//!
//! Last results (2-core shared VM, noisy: load average 5-6 from other builds; 2026-11-23,
//! after the wake gate; the figures before it, on a quieter machine, were 2.65 µs, 354 µs,
//! 3.1 µs and 1.26 ms):
//! - `dispatch/no_watchers`: 2.80 µs
//! - `dispatch/10k_same_namespace`: 544 µs (~54 ns per matching watcher)
//! - `dispatch/10k_namespaces_one_matching`: 3.8 µs (the baseline plus one watcher)
//! - `fanout/10k_json`: 1.97 ms (apply + 10,000 drains, one JSON encoding: ~200 ns per
//!   watcher, single-threaded)
//! - `wake/10k_direct`: 216-379 µs over four runs (apply, dispatch, 10,000 wake-ups)
//! - `wake/10k_paced`: 257-421 µs over the same runs (below direct in two, equal in one):
//!   pacing adds nothing measurable above this machine's noise
//!
//! Wake groups (2026-11-27, a build running beside): `wake/10k_direct` 247 µs,
//! `wake/10k_paced` 329 µs, `wake/10k_paced_100_groups` 387 µs: ordering 10,000 wake-ups by
//! group costs about 6 ns each.
//!
//! Dispatch allocating nothing per event (2026-11-27: queues grown by their watchers, the
//! wake list and the gate's slots kept, the frames watchers need encoded in `apply`): the
//! bench binaries of the commit before and after, alternating, three runs each, filtered to
//! three benches: `dispatch/10k_same_namespace` 218-230 µs before, 222-243 µs after (within
//! noise); `dispatch/10k_namespaces_one_matching` 2.81-2.84 µs before, 2.96-3.17 µs after (the
//! one watcher's JSON frame is now encoded inside `apply`, timed, instead of in its drain);
//! `fanout/10k_json` 1.13-1.20 ms before, 1.08-1.14 ms after.
//!
//! Drains that write nothing every watcher shares (2026-11-27: frames taken under the lock,
//! no clone of the cache's `Arc` or of the event's): the bench binaries of the commit before
//! and after, alternating, three runs each: `fanout/10k_json` 1.07-1.09 ms before, 0.95-1.01
//! ms after; `fanout/10k_json_2_threads` 1.25-1.29 ms before (two threads took longer than
//! one), 0.90-0.91 ms after. A cache lock sharded by thread (crossbeam's `ShardedLock`) on
//! top gave 0.82-0.84 ms, but delayed events end to end (`svc-loadtest fanout`, 5k × 100
//! writes/s, 8 runs each: p50 24 → 30 ms, p99 76 → 105 ms): not kept.
//!
//! The field index (2026-11-27, quiet machine): `dispatch/10k_pinned_nodes_one_matching`
//! 2.12 µs; with the index turned off (every pinned watcher in the all-namespaces bucket,
//! visited and filtered per event) 145 µs, 68× more. Same run: `no_watchers` 2.55 µs,
//! `10k_same_namespace` 277 µs, `10k_namespaces_one_matching` 2.98 µs.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use svc_benches::{filled_cache, put};
use svc_core::kinds::ServiceAccount;
use svc_core::selector::{FieldSelector, LabelSelector};
use svc_core::watch::unstructured;
use svc_core::watch::{
    FrameFormat, KindCodec, Selector, WakeGate, WatchCache, WatchCacheConfig, WatchRequest,
    WatchStart, Watcher,
};
use svc_storage::{Event, EventKind, FeedItem, KeyValue, Revision};

const WATCHERS: usize = 10_000;

/// Pods as proxy mode describes them at run time.
static PODS: svc_core::ResourceInfo = svc_core::ResourceInfo {
    group: "",
    version: "v1",
    kind: "Pod",
    list_kind: "PodList",
    plural: "pods",
    singular: "pod",
    short_names: &[],
    scope: svc_core::resource::Scope::Namespaced,
    verbs: &["list", "watch"],
    name_rule: svc_core::validation::NameRule::PathSegment,
    extra_fields: &["spec.nodeName"],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: &[],
    columns: &[],
    schema: svc_core::resource::no_schema,
    subresources: &[],
    stored: true,
    expires: false,
};

/// A pod on `node`, written at `rev`, as the upstream sends it.
fn pod_event(name: &str, node: &str, rev: Revision) -> Event {
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rev}"}},"spec":{{"nodeName":"{node}"}}}}"#
    );
    Event {
        kind: EventKind::Put,
        kv: KeyValue {
            key: PODS.key("ns", name).into(),
            value: json.into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
        },
        prev_kv: None,
    }
}

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

    let pods = WatchCache::new(unstructured::codec(&PODS), config.clone());
    pods.replace(&[], 1, Instant::now());
    let mut pod_rev: Revision = 1;
    let mut kubelets: Vec<Watcher> = (0..WATCHERS)
        .map(|i| {
            let fields =
                FieldSelector::parse(&format!("spec.nodeName=node-{i}"), |f| f == "spec.nodeName")
                    .unwrap();
            let req = WatchRequest {
                namespace: None,
                selector: Selector::new(LabelSelector::default(), fields),
                start: WatchStart::Now,
                bookmarks: false,
                format: FrameFormat::Json,
            };
            pods.watch(req, Instant::now()).unwrap()
        })
        .collect();
    group.bench_function("10k_pinned_nodes_one_matching", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                pod_rev += 1;
                let item = FeedItem::Events(vec![pod_event("p", "node-1", pod_rev)]);
                let start = Instant::now();
                pods.apply(item, Instant::now());
                total += start.elapsed();
                kubelets[1].drain(1 << 20, Instant::now());
            }
            total
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

/// Registers a (no-op) waker for every watcher, as a watch body waiting on `ready` does.
fn wait_all(watchers: &[Watcher]) {
    let mut cx = Context::from_waker(Waker::noop());
    for w in watchers {
        let mut ready = w.ready();
        let _ = Pin::new(&mut ready).poll(&mut cx);
    }
}

fn bench_wake(c: &mut Criterion) {
    let config = WatchCacheConfig {
        watcher_queue_limit: 1 << 12,
        ..WatchCacheConfig::default()
    };
    let mut group = c.benchmark_group("wake");
    for (name, gate, groups) in [
        ("10k_direct", WakeGate::direct(), 0),
        ("10k_paced", WakeGate::paced(64), 0),
        ("10k_paced_100_groups", WakeGate::paced(64), 100),
    ] {
        let cache = WatchCache::with_gate(
            KindCodec::with_protobuf::<ServiceAccount>(),
            config.clone(),
            Arc::clone(&gate),
        );
        let mut rev = 1;
        cache.replace(&[], rev, Instant::now());
        let mut watchers: Vec<Watcher> = (0..WATCHERS).map(|_| watch(&cache, "ns-0001")).collect();
        if groups > 0 {
            // Spread round-robin over h2 connections, as clients open them.
            for (i, w) in watchers.iter().enumerate() {
                w.set_wake_group(1 + (i % groups) as u64);
            }
        }
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    wait_all(&watchers);
                    rev += 1;
                    let ev = put("ns-0001", "sa-0000001", rev as u64, rev);
                    let start = Instant::now();
                    cache.apply(FeedItem::Events(vec![ev]), start);
                    while gate.release() > 0 {}
                    total += start.elapsed();
                    drain_all(&mut watchers);
                }
                total
            })
        });
    }
    group.finish();
}

/// `fanout/10k_json_2_threads`: `apply`, then two threads draining 5,000 watchers each at
/// once, as two request threads deliver one event: what the drains of different cores share
/// (the cache, its lock, the event, its frame) is written by both.
fn bench_parallel_drains(c: &mut Criterion) {
    const THREADS: usize = 2;
    let config = WatchCacheConfig {
        watcher_queue_limit: 1 << 12,
        ..WatchCacheConfig::default()
    };
    let (cache, mut rev) = filled_cache(config, 1000, 10, Instant::now());
    let start = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let drained = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut mine: Vec<Watcher> = (0..WATCHERS / THREADS)
                .map(|_| watch(&cache, "ns-0001"))
                .collect();
            let (start, done, stop, drained) =
                (start.clone(), done.clone(), stop.clone(), drained.clone());
            std::thread::spawn(move || {
                loop {
                    start.wait();
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    drained.fetch_add(drain_all(&mut mine), Ordering::Relaxed);
                    done.wait();
                }
            })
        })
        .collect();
    let mut group = c.benchmark_group("fanout");
    group.bench_function("10k_json_2_threads", |b| {
        b.iter_custom(|iters| {
            time_applies(&cache, &mut rev, "ns-0001", iters, |_| {
                let t = Instant::now();
                start.wait();
                done.wait();
                t.elapsed()
            })
        })
    });
    group.finish();
    stop.store(true, Ordering::Release);
    start.wait();
    for w in workers {
        w.join().unwrap();
    }
    let n = drained.load(Ordering::Relaxed);
    assert!(
        n > 0 && n.is_multiple_of(WATCHERS),
        "{n} frames: every watcher one per event"
    );
}

criterion_group!(benches, bench_dispatch, bench_wake, bench_parallel_drains);
criterion_main!(benches);
