//! The EventRateLimit plugin's cost per event create: one `EventRateLimiter::check` (key,
//! lock, LRU lookup, token bucket), per limit type, for a hit (the key's bucket is cached)
//! and a miss (a new key: a bucket is made and the least recently used one evicted).
//!
//! Limits are set so high that nothing is refused: a refusal costs the same lookup plus the
//! message. Misses cycle through twice `cacheSize` (4096) subjects, so every lookup misses.
//!
//! Run: `cargo bench -p svc-benches --bench admission`
//! (quick: `-- --warm-up-time 1 --measurement-time 3`).
//!
//! Last results (2-core shared AMD EPYC VM, noisy; 2026-11-23; criterion median):
//!
//! | limit type | hit | miss |
//! |---|---:|---:|
//! | `Server` | 17 ns | (one bucket) |
//! | `Namespace` | 26 ns | 146 ns |
//! | `User` | 32 ns | 118 ns |
//! | `SourceAndObject` | 67 ns | 168 ns |
//!
//! An acknowledged event create costs ~215 µs of server CPU (BENCHMARKS.md, `events`:
//! ~6,000 creates/s at ~130% CPU), so even a miss on every one of the four limits is well
//! under 1% of a create: it cannot show in the creates/s figure.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use svc_config::event_rate_limit::{
    Configuration, DEFAULT_CACHE_SIZE, Limit, NAMESPACE, SERVER, SOURCE_AND_OBJECT, USER,
};
use svc_config::rate_limit::{EventRateLimiter, Subject};
use svc_core::kinds::{Event, ObjectReference};

fn limiter(type_: &str) -> EventRateLimiter {
    let config = Configuration {
        limits: vec![Limit {
            type_: type_.into(),
            qps: i32::MAX,
            burst: i32::MAX,
            cache_size: Some(DEFAULT_CACHE_SIZE),
        }],
        ..Default::default()
    };
    EventRateLimiter::new(&config, 0)
}

/// A ~400-byte Event like the load harness's, about object `i`.
fn event(i: usize) -> Event {
    Event {
        reporting_controller: "svc.io/scheduler".into(),
        reporting_instance: "scheduler-1".into(),
        action: "Binding".into(),
        reason: "Scheduled".into(),
        note: format!("Scheduled pod-{i:05}"),
        type_: "Normal".into(),
        regarding: ObjectReference {
            kind: "Pod".into(),
            namespace: format!("ns-{i:05}"),
            name: format!("pod-{i:05}"),
            uid: format!("00000000-0000-0000-0000-{i:012}"),
            api_version: "v1".into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn bench_check(c: &mut Criterion) {
    let n = 2 * DEFAULT_CACHE_SIZE as usize;
    let events: Vec<Event> = (0..n).map(event).collect();
    let names: Vec<String> = (0..n).map(|i| format!("ns-{i:05}")).collect();
    let users: Vec<String> = (0..n)
        .map(|i| format!("system:serviceaccount:ns-{i:05}:default"))
        .collect();
    let subject = |i: usize| Subject {
        namespace: &names[i],
        user: &users[i],
        event: &events[i],
    };
    let mut group = c.benchmark_group("event_rate_limit");
    for type_ in [SERVER, NAMESPACE, USER, SOURCE_AND_OBJECT] {
        let l = limiter(type_);
        let s = subject(0);
        let mut now = 0u64;
        group.bench_function(format!("{type_}/hit"), |b| {
            b.iter(|| {
                now += 1;
                black_box(l.check(black_box(&s), now)).unwrap()
            })
        });
        if type_ == SERVER {
            continue;
        }
        let l = limiter(type_);
        let mut i = 0usize;
        group.bench_function(format!("{type_}/miss"), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                now += 1;
                black_box(l.check(black_box(&subject(i)), now)).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_check);
criterion_main!(benches);
