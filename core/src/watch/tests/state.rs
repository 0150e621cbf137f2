//! State, lists, snapshots and the history ring.

use std::collections::BTreeMap;

use super::*;
use crate::watch::history::HistoryRing;

#[test]
fn apply_updates_state_and_lists_per_namespace() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(
        &c,
        vec![
            put("a", "one", &[("app", "web")], 2),
            put("a", "two", &[], 3),
            put("b", "one", &[("app", "db")], 4),
            put("ab", "x", &[], 5),
        ],
        clock.at(1.0),
    );
    let all = sel("", "");
    let list = |ns: Option<&str>| {
        let req = ListRequest {
            namespace: ns,
            at: None,
            start_after: None,
            limit: None,
            selector: &all,
        };
        c.list(&req).unwrap()
    };
    // `a` must not match `ab`: prefixes end in `/`.
    assert_eq!(names(&list(Some("a")).items), ["a/one", "a/two"]);
    assert_eq!(
        names(&list(None).items),
        ["a/one", "a/two", "ab/x", "b/one"]
    );
    assert_eq!(list(None).revision, 5);

    apply(
        &c,
        vec![put("a", "one", &[("app", "api")], 6), del("a", "two", 7)],
        clock.at(2.0),
    );
    let a = list(Some("a"));
    assert_eq!(names(&a.items), ["a/one"]);
    assert_eq!(a.revision, 7);
    assert_eq!(a.items[0].resource_version, 6);
    assert_eq!(a.items[0].labels.get("app"), Some("api"));
    let json: serde_json::Value = serde_json::from_slice(&a.items[0].json).unwrap();
    assert_eq!(json["metadata"]["resourceVersion"], "6");
    assert_eq!(json["kind"], "ServiceAccount");

    // A list body splices the canonical JSON of each item.
    let meta = crate::ListMeta {
        resource_version: a.revision.to_string(),
        ..Default::default()
    };
    let body = crate::watch::frames::list_json("v1", "ServiceAccountList", &meta, &a.items, false)
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["kind"], "ServiceAccountList");
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    // Without the item's apiVersion and kind, as Kubernetes lists its built-in kinds...
    let mut bare = json.clone();
    bare.as_object_mut().unwrap().remove("apiVersion");
    bare.as_object_mut().unwrap().remove("kind");
    assert_eq!(body["items"][0], bare);
    assert!(body["items"][0].get("kind").is_none());
    // ... and with them, as it lists custom resources.
    let typed =
        crate::watch::frames::list_json("v1", "ServiceAccountList", &meta, &a.items, true).unwrap();
    let typed: serde_json::Value = serde_json::from_slice(&typed).unwrap();
    assert_eq!(typed["items"][0], json);
    // The same items as metadata alone.
    let partial = crate::watch::frames::partial_object_metadata_list(
        crate::watch::MetaGroup::K8s,
        &meta,
        &a.items,
    )
    .unwrap();
    let partial: serde_json::Value = serde_json::from_slice(&partial).unwrap();
    assert_eq!(partial["kind"], "PartialObjectMetadataList");
    assert_eq!(partial["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(partial["metadata"]["resourceVersion"], "7");
    assert_eq!(
        partial["items"][0],
        serde_json::json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": json["metadata"]})
    );
    let empty =
        crate::watch::frames::list_json("v1", "ServiceAccountList", &meta, &[], false).unwrap();
    assert!(
        serde_json::from_slice::<serde_json::Value>(&empty).unwrap()["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Redelivered events are skipped; a delete of an unknown key changes nothing.
    let r = c.apply(
        FeedItem::Events(vec![put("a", "zzz", &[], 6), del("q", "q", 8)]),
        clock.at(3.0),
    );
    assert_eq!((r.applied, r.skipped), (0, 2));
    assert_eq!(c.revision(), 8);
    let (obj, rev) = c.get(&sa_key("b", "one")).unwrap();
    assert_eq!((obj.unwrap().resource_version, rev), (4, 8));
}

#[test]
fn lists_apply_label_and_field_selectors() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(
        &c,
        vec![
            put("a", "web-1", &[("app", "web"), ("tier", "fe")], 2),
            put("a", "web-2", &[("app", "web")], 3),
            put("a", "db", &[("app", "db")], 4),
            put("b", "web-1", &[("app", "web")], 5),
        ],
        clock.at(1.0),
    );
    let check = |ns: Option<&str>, labels: &str, fields: &str, expected: &[&str]| {
        let s = sel(labels, fields);
        let req = ListRequest {
            namespace: ns,
            at: None,
            start_after: None,
            limit: None,
            selector: &s,
        };
        assert_eq!(
            names(&c.list(&req).unwrap().items),
            expected,
            "{labels} / {fields}"
        );
    };
    check(None, "app=web", "", &["a/web-1", "a/web-2", "b/web-1"]);
    check(Some("a"), "app in (web,db),!tier", "", &["a/db", "a/web-2"]);
    check(None, "", "metadata.name=web-1", &["a/web-1", "b/web-1"]);
    check(None, "app", "metadata.namespace!=a", &["b/web-1"]);
    check(Some("b"), "tier=fe", "", &[]);
}

#[test]
fn pages_come_from_one_snapshot_with_remaining_counts() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    let events = (0..10)
        .map(|i| put(if i < 6 { "a" } else { "b" }, &format!("o{i}"), &[], 2 + i))
        .collect();
    apply(&c, events, clock.at(1.0));
    let all = sel("", "");
    let first = c
        .list(&ListRequest {
            namespace: None,
            at: None,
            start_after: None,
            limit: Some(4),
            selector: &all,
        })
        .unwrap();
    assert_eq!(names(&first.items), ["a/o0", "a/o1", "a/o2", "a/o3"]);
    assert_eq!((first.revision, first.remaining), (11, Some(6)));

    // Writes between pages do not show up in later pages of the same list.
    apply(
        &c,
        vec![del("a", "o4", 12), put("b", "new", &[], 13)],
        clock.at(2.0),
    );
    let mut pages = vec![first.clone()];
    while let Some(after) = pages.last().and_then(|p| p.continue_after.clone()) {
        let page = c
            .list(&ListRequest {
                namespace: None,
                at: Some(first.revision),
                start_after: Some(&after),
                limit: Some(4),
                selector: &all,
            })
            .unwrap();
        assert_eq!(page.revision, 11);
        pages.push(page);
        assert!(pages.len() < 10, "paging must end");
    }
    let got: Vec<String> = pages.iter().flat_map(|p| names(&p.items)).collect();
    let expected: Vec<String> = (0..10)
        .map(|i| format!("{}/o{i}", if i < 6 { "a" } else { "b" }))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(pages[1].remaining, Some(2));
    assert_eq!(
        (pages[2].continue_after.clone(), pages[2].remaining),
        (None, None)
    );

    // Within one namespace, and with a selector (no remaining count then).
    let web = sel("", "metadata.name!=o1");
    let ns = c
        .list(&ListRequest {
            namespace: Some("a"),
            at: Some(11),
            start_after: None,
            limit: Some(2),
            selector: &web,
        })
        .unwrap();
    assert_eq!(names(&ns.items), ["a/o0", "a/o2"]);
    assert_eq!(ns.remaining, None);
    assert!(ns.continue_after.is_some());
}

/// A deterministic pseudo-random sequence (no dependency, same every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

type Model = BTreeMap<Bytes, Revision>;

fn model_of(s: &Snapshot) -> Model {
    s.state
        .iter()
        .map(|(k, v)| (k.clone(), v.resource_version))
        .collect()
}

#[test]
fn snapshot_at_is_exact_for_every_revision_in_the_window() {
    let clock = Clock::new();
    let cfg = WatchCacheConfig {
        snapshot_window: Duration::from_secs(30),
        snapshot_min_interval: Duration::from_secs(1),
        ..config()
    };
    let c = cache_with(cfg, &clock);
    let mut rng = Lcg(7);
    let mut model = Model::new();
    let mut history: Vec<(Revision, Model)> = vec![(1, model.clone())];
    let mut rev = 1;
    let mut t = 0.0;
    for _ in 0..40 {
        t += 0.3;
        let mut batch = Vec::new();
        for _ in 0..=rng.next(3) {
            rev += 1;
            let name = format!("k{}", rng.next(12));
            if rng.next(4) == 0 {
                batch.push(del("ns", &name, rev));
                model.remove(&sa_key("ns", &name));
            } else {
                batch.push(put("ns", &name, &[], rev));
                model.insert(sa_key("ns", &name), rev);
            }
            history.push((rev, model.clone()));
        }
        c.apply(FeedItem::Events(batch), clock.at(t));
    }
    assert!(
        c.stats().snapshots < 40,
        "snapshots are coalesced, not one per batch"
    );
    for r in 1..=rev {
        let expected = &history.iter().rev().find(|(hr, _)| *hr <= r).unwrap().1;
        let snap = c.snapshot_at(r).unwrap();
        assert_eq!(snap.revision, r);
        assert_eq!(&model_of(&snap), expected, "state at {r}");
    }
    let future = c.snapshot_at(rev + 1).unwrap_err();
    assert_eq!((future.code(), future.reason()), (504, "Timeout"));

    // Long after the writes, only what the newest snapshot and the ring can rebuild stays.
    c.apply(FeedItem::Progress(rev + 5), clock.at(t + 60.0));
    assert_eq!(c.stats().snapshots, 1);
    assert_eq!(c.snapshot_at(1).unwrap_err().code(), 410);
    assert_eq!(model_of(&c.snapshot_at(rev + 5).unwrap()), model);
    assert_eq!(model_of(&c.snapshot_at(rev).unwrap()), model);
}

#[test]
fn snapshots_are_bounded_by_the_bytes_they_alone_keep_alive() {
    let clock = Clock::new();
    let probe = cache_with(config(), &clock);
    apply(&probe, vec![put("a", "o", &[], 2)], clock.at(0.0));
    let one = probe
        .snapshot()
        .unwrap()
        .get(&sa_key("a", "o"))
        .unwrap()
        .heap_size();
    let cfg = WatchCacheConfig {
        snapshot_min_interval: Duration::ZERO,
        snapshot_max_bytes: one * 10,
        ..config()
    };
    let c = cache_with(cfg, &clock);
    apply(&c, vec![put("a", "o", &[], 2)], clock.at(0.0));
    for r in 3..40 {
        // Each batch replaces the object one snapshot holds: one object's worth per snapshot.
        apply(&c, vec![put("a", "o", &[], r)], clock.at(r as f64 * 0.01));
    }
    let s = c.stats();
    assert!(
        s.snapshot_bytes <= one * 10,
        "{} > {}",
        s.snapshot_bytes,
        one * 10
    );
    assert!((9..=11).contains(&s.snapshots), "{} snapshots", s.snapshots);
    assert_eq!(c.snapshot_at(5).unwrap_err().code(), 410);
    assert_eq!(
        c.snapshot_at(33)
            .unwrap()
            .get(&sa_key("a", "o"))
            .unwrap()
            .resource_version,
        33
    );
}

#[test]
fn without_list_snapshots_only_the_current_state_is_listable() {
    let clock = Clock::new();
    let cfg = WatchCacheConfig {
        list_snapshots: false,
        snapshot_min_interval: Duration::ZERO,
        ..config()
    };
    let c = cache_with(cfg, &clock);
    apply(&c, vec![put("a", "o", &[], 2)], clock.at(0.0));
    apply(&c, vec![put("a", "p", &[], 3)], clock.at(1.0));
    apply(
        &c,
        vec![put("a", "q", &[], 4), put("a", "r", &[], 5)],
        clock.at(2.0),
    );
    let s = c.stats();
    assert_eq!((s.snapshots, s.snapshot_bytes), (0, 0));
    // The current revision is the current state; any older one is not kept (410), so the
    // caller reads the store's history instead.
    assert_eq!(model_of(&c.snapshot_at(5).unwrap()).len(), 4);
    assert_eq!(c.snapshot_at(3).unwrap_err().code(), 410);
    // Counters for metrics: events from the feed, and fills from a full read.
    assert_eq!((s.events_received, s.initializations), (4, 1));
}

#[test]
fn history_is_bounded_by_count_time_and_bytes() {
    let clock = Clock::new();
    // By count.
    let c = cache_with(
        WatchCacheConfig {
            history_max_events: 5,
            ..config()
        },
        &clock,
    );
    apply(
        &c,
        (2..12)
            .map(|r| put("a", &format!("o{r}"), &[], r))
            .collect(),
        clock.at(1.0),
    );
    let s = c.stats();
    assert_eq!((s.history_events, s.oldest_revision), (5, 6));
    let all = sel("", "");
    let from = |rv| {
        c.watch(
            watch_req(None, all.clone(), WatchStart::After(rv)),
            clock.at(2.0),
        )
    };
    assert_eq!(from(5).unwrap_err().code(), 410);
    assert!(
        from(5)
            .unwrap_err()
            .to_string()
            .contains("too old resource version: 5 (6)")
    );
    assert!(from(6).is_ok());
    assert_eq!(from(12).unwrap_err().code(), 504);

    // By time: events older than the window leave at the next apply or prune.
    let c = cache_with(
        WatchCacheConfig {
            history_window: Duration::from_secs(10),
            ..config()
        },
        &clock,
    );
    for r in 2..12 {
        apply(
            &c,
            vec![put("a", &format!("o{r}"), &[], r)],
            clock.at(r as f64),
        );
    }
    assert_eq!(c.stats().history_events, 10);
    assert_eq!(c.prune(clock.at(15.5)), 4); // t = 2..5 are older than 10 s
    assert_eq!(c.oldest_revision(), 5);

    // By bytes, frames included.
    let probe = cache_with(config(), &clock);
    apply(&probe, vec![put("a", "o99", &[], 2)], clock.at(1.0));
    let one = probe.stats().history_bytes;
    let c = cache_with(
        WatchCacheConfig {
            history_max_bytes: one * 4,
            ..config()
        },
        &clock,
    );
    apply(
        &c,
        (2..12)
            .map(|r| put("a", &format!("o{r}"), &[], r))
            .collect(),
        clock.at(1.0),
    );
    let s = c.stats();
    assert!(
        s.history_bytes <= one * 4,
        "{} > {}",
        s.history_bytes,
        one * 4
    );
    assert_eq!(s.history_events, 4);
    let mut w = c
        .watch(
            watch_req(None, all.clone(), WatchStart::After(s.oldest_revision)),
            clock.at(1.0),
        )
        .unwrap();
    assert_eq!(w.drain(1 << 20, clock.at(1.0)).frames.len(), 4);
    let with_frames = c.stats().history_bytes;
    assert!(
        with_frames > s.history_bytes,
        "encoded frames are charged to the ring"
    );
    apply(&c, vec![put("a", "last", &[], 12)], clock.at(1.0));
    let s = c.stats();
    assert!(
        s.history_bytes <= one * 4,
        "{} > {}",
        s.history_bytes,
        one * 4
    );
    assert!(s.history_events < 4, "frames pushed older events out");
}

#[test]
fn an_interval_reports_overrun_once_the_ring_moves_past_it() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(
        &c,
        (2..6).map(|r| put("a", &format!("o{r}"), &[], r)).collect(),
        clock.at(1.0),
    );
    let inner = c.shared.inner.read();
    let ring: &HistoryRing = &inner.history;
    let mut iv = WatchCacheInterval::new(ring.seq_after(2), ring.next_seq());
    assert_eq!(iv.next(ring).unwrap().map(|e| e.revision), Some(3));
    drop(inner);

    let small = WatchCacheConfig {
        history_max_events: 1,
        ..config()
    };
    let mut ring = HistoryRing::default();
    let frame_bytes = std::sync::atomic::AtomicUsize::new(0);
    let c2 = c.snapshot().unwrap();
    for (seq, (_, obj)) in c2.state.iter().enumerate() {
        ring.push(Arc::new(WatchCacheEvent::new(
            EventType::Added,
            obj.clone(),
            None,
            obj.resource_version,
            seq as u64,
            clock.at(0.0),
        )));
    }
    let mut iv = WatchCacheInterval::new(0, ring.next_seq());
    assert_eq!(iv.next(&ring).unwrap().map(|e| e.revision), Some(2));
    ring.evict(clock.at(1.0), &small, &frame_bytes);
    assert_eq!(ring.len(), 1);
    assert_eq!(iv.next(&ring).unwrap_err(), Overrun { oldest_revision: 4 });
    assert_eq!(
        iv.next(&ring).unwrap_err(),
        Overrun { oldest_revision: 4 },
        "stays overrun"
    );
    let mut tail = WatchCacheInterval::new(ring.first_seq(), ring.next_seq());
    assert_eq!(tail.next(&ring).unwrap().map(|e| e.revision), Some(5));
    assert!(tail.next(&ring).unwrap().is_none() && tail.is_done());
}

#[test]
fn progress_advances_the_revision_and_wakes_waiters() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    let waker = Arc::new(CountingWaker::default());
    let mut wait = c.wait_for_revision(10);
    assert!(poll_once(&mut wait, &waker).is_pending());
    c.apply(FeedItem::Progress(9), clock.at(1.0));
    assert_eq!(waker.count(), 0);
    c.apply(FeedItem::Progress(10), clock.at(1.0));
    assert_eq!(waker.count(), 1);
    assert!(matches!(poll_once(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert_eq!(c.revision(), 10);
    // A list at the progress revision is the state as of the last event: exact.
    assert_eq!(c.snapshot_at(10).unwrap().revision, 10);
    let mut done = c.wait_for_revision(3);
    assert!(matches!(poll_once(&mut done, &waker), Poll::Ready(Ok(()))));
}

#[test]
fn not_ready_until_filled_and_undecodable_objects_are_reported() {
    let clock = Clock::new();
    let c = WatchCache::new(KindCodec::json::<ServiceAccount>(), config());
    assert_eq!(c.snapshot().unwrap_err().code(), 429);
    let r = c.apply(FeedItem::Events(vec![put("a", "x", &[], 2)]), clock.at(0.0));
    assert_eq!(r.skipped, 1);
    let mut bad = sa_kv("a", "bad", &[], 3);
    bad.value = Bytes::from_static(b"{not json");
    let r = c.replace(&[sa_kv("a", "good", &[], 2), bad], 5, clock.at(0.0));
    assert_eq!((r.applied, r.error_count), (1, 1));
    assert!(
        r.errors[0]
            .to_string()
            .contains("/registry/serviceaccounts/a/bad")
    );
    assert_eq!(c.snapshot().unwrap().len(), 1);
    assert_eq!(c.oldest_revision(), 5);
}

#[test]
fn type_meta_leaves_list_items_only_where_it_leads_them() {
    use crate::watch::frames::without_type_meta;
    let join = |(head, rest): (&[u8], &[u8])| [head, rest].concat();
    for (json, want) in [
        (
            &br#"{"apiVersion":"v1","kind":"Pod","metadata":{}}"#[..],
            &br#"{"metadata":{}}"#[..],
        ),
        (
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{}}"#,
            br#"{"metadata":{}}"#,
        ),
        (
            br#"{"kind":"Pod","metadata":{"kind":"x"}}"#,
            br#"{"metadata":{"kind":"x"}}"#,
        ),
        (br#"{"apiVersion":"v1","kind":"Pod"}"#, b"{}"),
        // Left whole: not leading, escaped, spaced, or not an object.
        (
            br#"{"metadata":{},"kind":"Pod"}"#,
            br#"{"metadata":{},"kind":"Pod"}"#,
        ),
        (
            br#"{"kind":"P\"od","metadata":{}}"#,
            br#"{"kind":"P\"od","metadata":{}}"#,
        ),
        (br#"{ "kind":"Pod"}"#, br#"{ "kind":"Pod"}"#),
        (br#"{"kind":"Pod""#, br#"{"kind":"Pod""#),
        (b"[]", b"[]"),
    ] {
        assert_eq!(
            String::from_utf8(join(without_type_meta(json))).unwrap(),
            String::from_utf8(want.to_vec()).unwrap()
        );
    }
}
