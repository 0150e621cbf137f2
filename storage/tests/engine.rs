//! Embedded-engine behaviour beyond the conformance suite: recovery on reopen, lagging
//! watchers, closing, compaction in chunks and in the background, the directory lock.
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::time::Duration;

use futures::StreamExt;
use svc_storage::conformance::{events_until, ok, within};
use svc_storage::{
    AutoCompaction, EmbeddedConfig, EmbeddedStore, Event, FeedItem, KeyRange, RangeResult, Store,
    StoreError,
};

#[path = "support/embedded.rs"]
mod support;
use support::{config, key};

/// A deterministic mix of writes over a few keys; returns the revision after each write.
async fn churn(store: &EmbeddedStore, writes: usize) -> Vec<i64> {
    let mut revisions = Vec::new();
    for i in 0..writes {
        let k = key(&format!("/churn/{}", i % 5));
        let rev = match ok("get", store.get(k.clone(), None).await).0 {
            None => ok("create", store.create(k, key(&i.to_string())).await).mod_revision,
            Some(kv) if i % 3 == 0 => ok("delete", store.delete(k, Some(kv.mod_revision)).await).1,
            Some(kv) => {
                ok(
                    "update",
                    store.update(k, key(&i.to_string()), kv.mod_revision).await,
                )
                .mod_revision
            }
        };
        revisions.push(rev);
    }
    revisions
}

async fn everything_at(store: &EmbeddedStore, rev: i64) -> RangeResult {
    ok(
        "range",
        store.range(KeyRange::prefix("/"), Some(rev), 0).await,
    )
}

#[tokio::test]
async fn reopen_continues_revisions_and_keeps_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let revisions = churn(&store, 40).await;
    let mut snapshots = Vec::new();
    for &rev in &revisions {
        snapshots.push(everything_at(&store, rev).await);
    }
    let mut feed = store.watch(KeyRange::prefix("/"), 0);
    let events = events_until(&mut feed, *revisions.last().unwrap()).await;
    drop(feed);
    drop(store);

    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let last = *revisions.last().unwrap();
    assert_eq!(ok("current_revision", store.current_revision().await), last);
    for (rev, before) in revisions.iter().zip(&snapshots) {
        assert_eq!(
            &everything_at(&store, *rev).await,
            before,
            "range at {rev} after reopen"
        );
    }
    let mut feed = store.watch(KeyRange::prefix("/"), 0);
    assert_eq!(
        events_until(&mut feed, last).await,
        events,
        "replay after reopen"
    );
    let next = ok("create", store.create(key("/after"), key("x")).await);
    assert_eq!(next.mod_revision, last + 1);
}

#[tokio::test]
async fn a_directory_is_opened_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    match EmbeddedStore::open(dir.path(), config()) {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("second open: expected Unavailable, got {other:?}"),
    }
    drop(store);
    EmbeddedStore::open(dir.path(), config()).unwrap();
}

#[tokio::test]
async fn lagging_watcher_replays_instead_of_losing_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(
        dir.path(),
        EmbeddedConfig {
            feed_capacity: 1,
            replay_chunk: 7,
            ..config()
        },
    )
    .unwrap();
    let mut feed = store.watch(KeyRange::prefix("/"), 0);
    // Start the feed, then let it fall far behind the live broadcast.
    let first = ok("create", store.create(key("/lag/first"), key("v")).await);
    assert_eq!(events_until(&mut feed, first.mod_revision).await.len(), 1);
    let revisions = churn(&store, 200).await;
    let last = *revisions.last().unwrap();
    // Keep writing while it catches up, to cross from replay back to live.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move { churn(&store, 100).await })
    };
    let more = within("writer", writer).await.unwrap();
    let end = *more.last().unwrap();
    let events = events_until(&mut feed, end).await;
    let seen: Vec<i64> = events.iter().map(Event::revision).collect();
    let expected: Vec<i64> = (first.mod_revision + 1..=end).collect();
    assert_eq!(seen, expected, "every revision once, in order");
    assert!(last < end);
}

#[tokio::test]
async fn close_answers_queued_writes_and_ends_feeds() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let mut feed = store.watch(KeyRange::prefix("/"), 0);
    let kv = ok("create", store.create(key("/c"), key("v")).await);
    let writers: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create(key(&format!("/q/{i:02}")), key("v")).await })
        })
        .collect();
    // Let some of them queue up, then close underneath the rest.
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    store.close();
    let mut acknowledged = Vec::new();
    for writer in writers {
        match within("writer", writer).await.unwrap() {
            Ok(kv) => acknowledged.push(kv),
            Err(StoreError::Closed) => {}
            Err(other) => panic!("write racing close: expected success or Closed, got {other}"),
        }
    }
    match store.create(key("/d"), key("v")).await {
        Err(StoreError::Closed) => {}
        other => panic!("write after close: expected Closed, got {other:?}"),
    }
    assert!(matches!(store.health().await, Err(StoreError::Closed)));
    // Reads still work until the handle is dropped.
    assert_eq!(ok("get", store.get(key("/c"), None).await).0, Some(kv));
    within("the feed to end", async {
        while let Some(item) = feed.next().await {
            assert!(item.is_ok(), "feed failed: {item:?}");
        }
    })
    .await;
    drop(store);
    // Every write that was answered with success is durable.
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    for kv in acknowledged {
        assert_eq!(ok("get", store.get(kv.key.clone(), None).await).0, Some(kv));
    }
}

#[tokio::test]
async fn dropping_the_store_ends_feeds_and_releases_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    ok("create", store.create(key("/x"), key("v")).await);
    let mut feed = store.watch(KeyRange::prefix("/"), 0);
    drop(store);
    // The directory is free even though a feed is still alive.
    let reopened = EmbeddedStore::open(dir.path(), config()).unwrap();
    within("the old feed to end", async {
        while let Some(item) = feed.next().await {
            if let Ok(FeedItem::Events(_)) | Ok(FeedItem::Progress(_)) = item {
                continue;
            }
            break;
        }
    })
    .await;
    assert_eq!(ok("current_revision", reopened.current_revision().await), 1);
}

#[tokio::test]
async fn chunked_compaction_keeps_every_later_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(
        dir.path(),
        EmbeddedConfig {
            compaction_chunk: 7,
            ..config()
        },
    )
    .unwrap();
    let revisions = churn(&store, 120).await;
    let last = *revisions.last().unwrap();
    let mut before = Vec::new();
    for rev in 1..=last {
        before.push(everything_at(&store, rev).await);
    }
    let mut feed = store.watch(KeyRange::prefix("/"), 0);
    let all_events = events_until(&mut feed, last).await;

    for point in [3, 50, 51, 90, last] {
        ok("compact", store.compact(point).await);
        assert_eq!(ok("compacted", store.compacted_revision().await), point);
        for rev in 1..point {
            assert!(matches!(
                store.range(KeyRange::prefix("/"), Some(rev), 0).await,
                Err(StoreError::Compacted { .. })
            ));
        }
        for rev in point..=last {
            let idx = usize::try_from(rev - 1).unwrap();
            assert_eq!(
                everything_at(&store, rev).await,
                before[idx],
                "range at {rev} after compacting at {point}"
            );
        }
        if point < last {
            let mut feed = store.watch(KeyRange::prefix("/"), point);
            let replayed = events_until(&mut feed, last).await;
            let expected: Vec<_> = all_events
                .iter()
                .filter(|e| e.revision() > point)
                .cloned()
                .collect();
            assert_eq!(replayed, expected, "replay after compacting at {point}");
        }
    }
    drop(store);
    // The compacted store reopens (its log starts at the compaction point).
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    assert_eq!(ok("compacted", store.compacted_revision().await), last);
    assert_eq!(everything_at(&store, last).await, before[before.len() - 1]);
}

async fn wait_for_compaction(store: &EmbeddedStore, at_least: i64) {
    within("background compaction", async {
        while ok("compacted", store.compacted_revision().await) < at_least {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn background_compaction_by_revision_count() {
    let dir = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig {
        auto_compaction: AutoCompaction::Revisions(10),
        compaction_check_interval: Duration::from_millis(5),
        ..config()
    };
    let store = EmbeddedStore::open(dir.path(), config).unwrap();
    let revisions = churn(&store, 60).await;
    let last = *revisions.last().unwrap();
    wait_for_compaction(&store, last - 10).await;
    let compacted = ok("compacted", store.compacted_revision().await);
    assert!(
        compacted <= last - 10,
        "kept fewer than 10 revisions: compacted at {compacted}"
    );
    assert!(matches!(
        store.get(key("/churn/0"), Some(1)).await,
        Err(StoreError::Compacted { .. })
    ));
    everything_at(&store, last - 10).await;
}

#[tokio::test]
async fn background_compaction_by_retention_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig {
        auto_compaction: AutoCompaction::Retention(Duration::from_millis(100)),
        compaction_check_interval: Duration::from_millis(5),
        ..config()
    };
    let store = EmbeddedStore::open(dir.path(), config).unwrap();
    let revisions = churn(&store, 30).await;
    let last = *revisions.last().unwrap();
    // Once the writes are older than the retention, history up to the last one goes.
    wait_for_compaction(&store, last).await;
    let state = ok("range", store.range(KeyRange::prefix("/"), None, 0).await);
    assert!(
        !state.kvs.is_empty(),
        "compaction must keep the current state"
    );
}

/// Deadlines are in the data file: a key whose time to live passed while the store was closed
/// goes right after the next open (a revisioned delete its feeds see), and one whose time has
/// not come stays.
#[tokio::test]
async fn expiry_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let short = ok(
        "create short",
        store
            .create_with_ttl(key("/ttl/short"), key("s"), Duration::from_millis(300))
            .await,
    );
    let long = ok(
        "create long",
        store
            .create_with_ttl(key("/ttl/long"), key("l"), Duration::from_secs(600))
            .await,
    );
    store.close();
    drop(store);
    // Past the short deadline while closed.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let store = EmbeddedStore::open(dir.path(), config()).unwrap();
    let mut feed = store.watch(KeyRange::prefix("/ttl/"), long.mod_revision);
    let events = events_until(&mut feed, long.mod_revision + 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, svc_storage::EventKind::Delete);
    assert_eq!(events[0].kv.key, short.key);
    assert_eq!(events[0].prev_kv.as_ref(), Some(&short));
    assert_eq!(ok("get", store.get(key("/ttl/short"), None).await).0, None);
    assert_eq!(
        ok("get", store.get(key("/ttl/long"), None).await).0,
        Some(long)
    );
}
