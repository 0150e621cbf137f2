//! Conformance tests of the change feed: order, resumption, filtering, progress, compaction.

use std::collections::HashSet;

use bytes::Bytes;
use futures::StreamExt;

use super::{Subject, assert_ordered, events_until, ok, within};
use crate::{Event, EventKind, FeedItem, KeyValue, Revision, StoreError};

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}

/// Writes a fixed mix of creates, updates and deletes under `name/`; returns the events the
/// feed must report for them, in order.
async fn write_mix(s: &Subject, name: &str) -> Vec<Event> {
    let mut expected = Vec::new();
    let put = |kv: &KeyValue, prev: Option<KeyValue>| Event {
        kind: EventKind::Put,
        kv: kv.clone(),
        prev_kv: prev,
    };
    let x = s.key(&format!("{name}/x"));
    let y = s.key(&format!("{name}/y"));
    let x1 = ok("create x", s.store.create(x.clone(), b("x1")).await);
    expected.push(put(&x1, None));
    let y1 = ok("create y", s.store.create(y.clone(), b("y1")).await);
    expected.push(put(&y1, None));
    let x2 = ok(
        "update x",
        s.store.update(x.clone(), b("x2"), x1.mod_revision).await,
    );
    expected.push(put(&x2, Some(x1)));
    let (deleted, rev) = ok("delete y", s.store.delete(y.clone(), None).await);
    expected.push(Event {
        kind: EventKind::Delete,
        kv: KeyValue {
            key: y.clone(),
            value: Bytes::new(),
            create_revision: 0,
            mod_revision: rev,
            version: 0,
        },
        prev_kv: Some(deleted),
    });
    let y2 = ok("re-create y", s.store.create(y, b("y2")).await);
    expected.push(put(&y2, None));
    let x3 = ok(
        "update x",
        s.store.update(x, b("x3"), x2.mod_revision).await,
    );
    expected.push(put(&x3, Some(x2)));
    expected
}

/// Runs `writers` tasks each doing one create and `writes - 1` updates of its own key under
/// `name/`; returns every acknowledged (key, revision).
pub async fn concurrent_writes(
    s: &Subject,
    name: &str,
    writers: usize,
    writes: usize,
) -> Vec<(Bytes, Revision)> {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = s.store.clone();
        let key = s.key(&format!("{name}/{w:03}"));
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::with_capacity(writes);
            let mut kv = ok("create", store.create(key.clone(), Bytes::from("0")).await);
            acked.push((key.clone(), kv.mod_revision));
            for i in 1..writes {
                let value = Bytes::from(i.to_string());
                kv = ok(
                    "update",
                    store.update(key.clone(), value, kv.mod_revision).await,
                );
                acked.push((key.clone(), kv.mod_revision));
            }
            acked
        }));
    }
    let mut all = Vec::with_capacity(writers * writes);
    for task in tasks {
        all.extend(
            within("writer task", task)
                .await
                .expect("writer task panicked"),
        );
    }
    all
}

pub async fn watch_from_zero_sees_everything_in_order(s: &Subject) {
    let compacted = ok("compacted_revision", s.store.compacted_revision().await);
    if compacted > 0 {
        // A shared, already compacted store cannot replay from 0; that case has its own test.
        return;
    }
    let expected = write_mix(s, "z").await;
    let mut feed = s.store.watch(s.range(), 0);
    let last = expected.last().map_or(0, Event::revision);
    let events = events_until(&mut feed, last).await;
    assert_eq!(events, expected);
}

pub async fn watch_resumes_exactly_from_the_middle(s: &Subject) {
    let expected = write_mix(s, "m").await;
    let last = expected[expected.len() - 1].revision();
    for cut in 0..expected.len() {
        let after = expected[cut].revision();
        let mut feed = s.store.watch(s.range(), after);
        let events = if cut + 1 == expected.len() {
            Vec::new()
        } else {
            events_until(&mut feed, last).await
        };
        assert_eq!(events, expected[cut + 1..], "watch after revision {after}");
    }
    // Resuming one below the first event replays everything.
    let mut feed = s.store.watch(s.range(), expected[0].revision() - 1);
    assert_eq!(events_until(&mut feed, last).await, expected);
}

pub async fn watch_is_filtered_by_range(s: &Subject) {
    let start = ok("current_revision", s.store.current_revision().await);
    let mut feed = s.store.watch(s.sub_range("in/"), start);
    let mut expected = Vec::new();
    for i in 0..5 {
        ok(
            "create out",
            s.store.create(s.key(&format!("inx{i}")), b("no")).await,
        );
        ok(
            "create out",
            s.store.create(s.key(&format!("i/{i}")), b("no")).await,
        );
        let kv = ok(
            "create in",
            s.store.create(s.key(&format!("in/{i}")), b("yes")).await,
        );
        expected.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: None,
        });
    }
    let last = ok("create out", s.store.create(s.key("in0"), b("no")).await);
    let mut events = events_until(&mut feed, expected[4].revision()).await;
    // Nothing else arrives: a write after the range proves the feed moved past it.
    let fence = ok(
        "create fence",
        s.store.create(s.key("in/~fence"), b("f")).await,
    );
    events.extend(events_until(&mut feed, fence.mod_revision).await);
    assert!(fence.mod_revision > last.mod_revision);
    expected.push(Event {
        kind: EventKind::Put,
        kv: fence,
        prev_kv: None,
    });
    assert_eq!(events, expected);
}

pub async fn watch_delivers_live_events(s: &Subject) {
    let start = ok("current_revision", s.store.current_revision().await);
    let mut feed = s.store.watch(s.range(), start);
    // Give the feed a chance to reach the live phase first; correctness must not depend on it.
    tokio::task::yield_now().await;
    for round in 0..3 {
        let kv = ok(
            "create",
            s.store
                .create(s.key(&format!("live/{round}")), b("v"))
                .await,
        );
        let events = events_until(&mut feed, kv.mod_revision).await;
        assert_eq!(
            events,
            vec![Event {
                kind: EventKind::Put,
                kv,
                prev_kv: None
            }]
        );
    }
}

pub async fn events_carry_prev_kv(s: &Subject) {
    let start = ok("current_revision", s.store.current_revision().await);
    let mut live = s.store.watch(s.range(), start);
    let expected = write_mix(s, "prev").await;
    let last = expected[expected.len() - 1].revision();
    let events = events_until(&mut live, last).await;
    assert_eq!(events, expected, "live events");
    let deletes: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Delete)
        .collect();
    assert_eq!(deletes.len(), 1);
    assert!(
        deletes[0]
            .prev_kv
            .as_ref()
            .is_some_and(|p| p.value == b("y1"))
    );
    // Replayed events carry the same prev_kv as live ones.
    let mut replay = s.store.watch(s.range(), start);
    assert_eq!(
        events_until(&mut replay, last).await,
        expected,
        "replayed events"
    );
}

pub async fn progress_arrives_when_idle(s: &Subject) {
    let kv = ok("create", s.store.create(s.key("idle"), b("v")).await);
    for after in [kv.mod_revision - 1, kv.mod_revision] {
        let mut feed = s.store.watch(s.range(), after);
        let mut saw_event = after == kv.mod_revision;
        let progress = within("a progress notification", async {
            loop {
                match feed.next().await {
                    Some(Ok(FeedItem::Progress(rev))) if rev >= kv.mod_revision => break rev,
                    Some(Ok(FeedItem::Progress(_))) => {}
                    Some(Ok(FeedItem::Events(events))) => {
                        assert!(events.iter().all(|e| e.revision() > after));
                        saw_event |= events.iter().any(|e| e.revision() == kv.mod_revision);
                    }
                    Some(Err(err)) => panic!("feed failed: {err}"),
                    None => panic!("feed ended"),
                }
            }
        })
        .await;
        assert!(saw_event, "progress arrived before the pending event");
        assert!(
            progress >= kv.mod_revision,
            "progress {progress} behind {}",
            kv.mod_revision
        );
    }
    // A watch on a range that never changes still gets progress past other writes.
    let mut quiet = s.store.watch(s.sub_range("never/"), kv.mod_revision);
    let other = ok("create", s.store.create(s.key("other"), b("v")).await);
    within("progress past an unrelated write", async {
        loop {
            match quiet.next().await {
                Some(Ok(FeedItem::Progress(rev))) if rev >= other.mod_revision => break,
                Some(Ok(FeedItem::Progress(_))) => {}
                other => panic!("unexpected feed item: {other:?}"),
            }
        }
    })
    .await;
}

/// Compacts the whole store.
pub async fn watch_from_compacted_revision_fails(s: &Subject) {
    let first = ok("create", s.store.create(s.key("wc/a"), b("1")).await);
    let second = ok(
        "update",
        s.store
            .update(first.key.clone(), b("2"), first.mod_revision)
            .await,
    );
    let third = ok("create", s.store.create(s.key("wc/b"), b("3")).await);
    ok("compact", s.store.compact(third.mod_revision).await);

    let mut feed = s.store.watch(s.range(), first.mod_revision);
    match within("the first feed item", feed.next()).await {
        Some(Err(StoreError::Compacted {
            requested,
            compacted,
        })) => {
            assert_eq!(requested, first.mod_revision);
            assert!(compacted >= third.mod_revision);
        }
        other => panic!("watch from a compacted revision: expected Compacted, got {other:?}"),
    }
    match within(
        "the first feed item",
        s.store.watch(s.range(), second.mod_revision).next(),
    )
    .await
    {
        Some(Err(StoreError::Compacted { .. })) => {}
        other => panic!("watch from a compacted revision: expected Compacted, got {other:?}"),
    }
    // From the compaction point on, the feed works.
    let compacted = ok("compacted_revision", s.store.compacted_revision().await);
    let mut feed = s.store.watch(s.range(), compacted);
    let next = ok("create", s.store.create(s.key("wc/c"), b("4")).await);
    let events = events_until(&mut feed, next.mod_revision).await;
    assert_eq!(events.last().map(|e| e.kv.clone()), Some(next));
}

/// 64 tasks × 50 writes while one watcher follows: it sees every acknowledged write, once,
/// in revision order.
pub async fn concurrent_writers_all_seen_in_order(s: &Subject) {
    let start = ok("current_revision", s.store.current_revision().await);
    let mut feed = s.store.watch(s.sub_range("cwo/"), start);
    let acked = concurrent_writes(s, "cwo", 64, 50).await;
    let last = acked.iter().map(|(_, rev)| *rev).max().unwrap_or(start);
    let events = events_until(&mut feed, last).await;
    assert_ordered(&events);
    let seen: Vec<(Bytes, Revision)> = events
        .iter()
        .map(|e| (e.kv.key.clone(), e.revision()))
        .collect();
    let acked_set: HashSet<_> = acked.iter().cloned().collect();
    let seen_set: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(
        seen.len(),
        acked.len(),
        "feed delivered a different number of events"
    );
    assert_eq!(seen_set, acked_set, "feed and acknowledgements disagree");
}
