//! Memory of watch fan-out, counted by a global allocator wrapper (not timed; no criterion):
//! - heap per cached object, 100,000 ServiceAccounts outside the history window (the
//!   cache's state, indexes and the object's JSON);
//! - heap per idle watcher, 10,000 watchers in one namespace and in 10,000 namespaces (the
//!   cache's slot and index entries plus the `Watcher` handle the gateway task holds);
//! - heap per watcher with one undrained event (a queued position, not a frame);
//! - a stalled watcher that never drains while 200,000 events go by, with the history ring
//!   bounded to 8 MiB and 8 snapshots: the process heap stays flat, and the watcher ends
//!   with 410.
//!
//! Run: `cargo bench -p svc-benches --bench watch_memory`
//!
//! Heap per cached object (2026-11-27): 1,498 B with labels in a `BTreeMap` (a node of
//! eleven slots however few the labels), 1,042 B with them in a sorted boxed slice
//! (`selector::Labels`); 326 B of either is the object's JSON. 858 B once the JSON and the
//! key are allocated at their size (a JSON of 326 B had sat in serde_json's 512 B buffer).
//!
//! Last results (2-core shared VM; 2026-11-23):
//! - heap per idle watcher: 303 B in one namespace, 439 B with one namespace each
//! - one pending event adds 32 B per watcher (a queued position; the frame is shared)
//! - stalled watcher, 8 MiB ring: process heap 12.6 MiB after 50k events, 13.2 MiB after
//!   100k, 13.1 MiB after 150k, 13.2 MiB after 200k; its drain is one `ERROR` 410 frame
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::alloc::System;
use std::time::Instant;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use svc_benches::{filled_cache, put};
use svc_core::watch::{
    FrameFormat, Selector, WatchCache, WatchCacheConfig, WatchRequest, WatchStart, Watcher,
};
use svc_storage::FeedItem;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const WATCHERS: usize = 10_000;
const OBJECTS: usize = 100_000;

/// Heap bytes currently allocated by the process.
fn live_heap() -> isize {
    let s = GLOBAL.stats();
    // Reallocations are already folded into both totals.
    s.bytes_allocated as isize - s.bytes_deallocated as isize
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

fn main() {
    // `cargo bench` passes `--bench`; a filter that names another bench skips this one.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"watch_memory".contains(&a))
    {
        return;
    }
    // The cache's share of a stored object: 100,000 ServiceAccounts outside the history
    // window (filled by a list, as after a start), in 100 namespaces.
    let before = live_heap();
    let (big, _) = filled_cache(WatchCacheConfig::default(), OBJECTS, 100, Instant::now());
    let per_object = (live_heap() - before) / OBJECTS as isize;
    let json = put("ns-0001", "sa-0000001", 0, 1).kv.value.len();
    let s = big.stats();
    println!(
        "heap per cached object, {OBJECTS} objects: {per_object} B ({json} B of it the object's \
         JSON; history {} B, snapshots {} holding {} B)",
        s.history_bytes, s.snapshots, s.snapshot_bytes
    );
    drop(big);

    let (cache, mut rev) = filled_cache(WatchCacheConfig::default(), 1000, 10, Instant::now());

    let before = live_heap();
    let same: Vec<Watcher> = (0..WATCHERS).map(|_| watch(&cache, "ns-0001")).collect();
    let per_idle = (live_heap() - before) / WATCHERS as isize;
    println!("heap per idle watcher, one namespace: {per_idle} B");

    let before = live_heap();
    rev += 1;
    cache.apply(
        FeedItem::Events(vec![put("ns-0001", "sa-0000001", 1, rev)]),
        Instant::now(),
    );
    let per_pending = (live_heap() - before) / WATCHERS as isize;
    println!(
        "heap added per watcher by one pending event (event itself amortized): {per_pending} B"
    );
    drop(same);

    let before = live_heap();
    let spread: Vec<Watcher> = (0..WATCHERS)
        .map(|i| watch(&cache, &format!("ns-{i:04}")))
        .collect();
    let per_spread = (live_heap() - before) / WATCHERS as isize;
    println!("heap per idle watcher, one namespace each: {per_spread} B");
    drop(spread);

    // A stalled watcher while the ring turns over many times.
    let config = WatchCacheConfig {
        history_max_bytes: 8 << 20,
        // The run lasts about a second, far less than the 75 s snapshot window: cap the
        // count so the plateau shows (at full rate the window and `snapshot_max_bytes` do).
        max_snapshots: 8,
        ..WatchCacheConfig::default()
    };
    let (cache, mut rev) = filled_cache(config, 1000, 10, Instant::now());
    let mut stalled = watch(&cache, "ns-0001");
    let mut samples = Vec::new();
    for round in 0..200_000u32 {
        rev += 1;
        let name = format!("sa-{:07}", (round % 100) * 10 + 1);
        cache.apply(
            FeedItem::Events(vec![put("ns-0001", &name, 1, rev)]),
            Instant::now(),
        );
        if round % 50_000 == 49_999 {
            let s = cache.stats();
            samples.push((
                round + 1,
                live_heap(),
                s.history_bytes,
                s.snapshots,
                s.snapshot_bytes,
            ));
        }
    }
    for (events, heap, ring, snapshots, pinned) in &samples {
        println!(
            "stalled watcher, after {events} events: process heap {} KiB, ring {} KiB, \
             {snapshots} snapshots holding {} KiB",
            heap / 1024,
            ring / 1024,
            pinned / 1024,
        );
    }
    let d = stalled.drain(1 << 20, Instant::now());
    let last = d
        .frames
        .last()
        .map(|f| String::from_utf8_lossy(f).into_owned());
    println!(
        "stalled watcher's drain: finished={}, last frame: {}",
        d.finished,
        last.unwrap_or_default().trim_end()
    );
}
