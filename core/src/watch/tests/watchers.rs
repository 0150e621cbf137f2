//! Watchers: selector transitions, frames shared across watchers, initial events and
//! bookmarks, slow consumers, and dispatch that visits only the matching watchers.

use super::*;
use crate::codec::{decode_envelope, decode_watch_event_protobuf};
use crate::watch::dispatch::{QUEUE_START, WatcherSlot};
use crate::watch::watcher::Bucket;

fn object(labels: &[(&str, &str)], rev: Revision) -> Arc<CachedObject> {
    Arc::new(crate::watch::cached::ingest::<ServiceAccount>(&sa_kv("a", "x", labels, rev)).unwrap())
}

/// One row of the transition table: the previous object's labels (None: a create), the
/// current one's (None: a delete), the watch's label selector, and what the watcher sees.
fn check(
    prev: Option<&[(&str, &str)]>,
    cur: Option<&[(&str, &str)]>,
    selector: &str,
    expected: Option<EventType>,
) {
    let prev_obj = prev.map(|l| object(l, 2));
    let (ty, obj) = match cur {
        Some(l) if prev.is_some() => (EventType::Modified, object(l, 3)),
        Some(l) => (EventType::Added, object(l, 3)),
        None => (EventType::Deleted, prev_obj.clone().unwrap()),
    };
    let ev = WatchCacheEvent::new(ty, obj, prev_obj, 3, 0, Instant::now());
    let filter = WatchFilter::new(Some("a"), sel(selector, ""), true);
    assert_eq!(
        filter.transition(&ev),
        expected,
        "{prev:?} -> {cur:?} with {selector:?}"
    );
    // Dispatch's shortcut, for the watcher found in the object's bucket, agrees.
    assert_eq!(filter.bucket(), Bucket::Namespace("a"));
    assert_eq!(
        filter.transition_in_bucket(&ev),
        expected,
        "in its bucket: {prev:?} -> {cur:?} with {selector:?}"
    );
}

#[test]
fn selector_transitions() {
    let web: &[(&str, &str)] = &[("app", "web")];
    let db: &[(&str, &str)] = &[("app", "db")];
    use EventType::*;
    check(None, Some(web), "app=web", Some(Added));
    check(None, Some(db), "app=web", None);
    check(Some(web), Some(web), "app=web", Some(Modified));
    check(Some(db), Some(web), "app=web", Some(Added));
    check(Some(web), Some(db), "app=web", Some(Deleted));
    check(Some(db), Some(db), "app=web", None);
    check(Some(web), None, "app=web", Some(Deleted));
    check(Some(db), None, "app=web", None);
    check(Some(db), Some(web), "", Some(Modified));
    check(Some(db), None, "", Some(Deleted));
    check(None, Some(db), "", Some(Added));
}

/// A watch that started ahead of the cache skips the events at or before its revision, with
/// or without a selector, in dispatch as elsewhere.
#[test]
fn a_watch_ahead_skips_events_in_its_bucket_too() {
    let ev = |rev| {
        WatchCacheEvent::new(
            EventType::Added,
            object(&[], rev),
            None,
            rev,
            0,
            Instant::now(),
        )
    };
    for selector in ["", "app!=db"] {
        let mut filter = WatchFilter::new(Some("a"), sel(selector, ""), true);
        filter.after = 5;
        assert_eq!(filter.transition_in_bucket(&ev(5)), None, "{selector:?}");
        assert_eq!(
            filter.transition_in_bucket(&ev(6)),
            Some(EventType::Added),
            "{selector:?}"
        );
    }
}

#[test]
fn filters_file_watchers_by_namespace_and_name() {
    let f = WatchFilter::new(None, sel("", "metadata.name=x"), false);
    assert_eq!(f.bucket(), Bucket::Name("", "x"));
    let f = WatchFilter::new(Some("a"), sel("", "metadata.name=x"), true);
    assert_eq!(f.bucket(), Bucket::Name("a", "x"));
    let f = WatchFilter::new(None, sel("", "metadata.namespace=b"), true);
    assert_eq!(f.bucket(), Bucket::Namespace("b"));
    let f = WatchFilter::new(Some(""), sel("", "metadata.name!=x"), true);
    assert_eq!(f.bucket(), Bucket::All);
}

#[test]
fn a_watch_sees_transitions_as_added_modified_deleted() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    let mut w = c
        .watch(
            watch_req(Some("a"), sel("app=web", ""), WatchStart::Now),
            clock.at(0.0),
        )
        .unwrap();
    apply(
        &c,
        vec![
            put("a", "x", &[("app", "web")], 2),
            put("b", "x", &[("app", "web")], 3),
            put("a", "x", &[("app", "db")], 4),
            put("a", "x", &[("app", "web")], 5),
            put("a", "x", &[("app", "web"), ("v", "2")], 6),
            del("a", "x", 7),
            put("a", "y", &[], 8),
        ],
        clock.at(1.0),
    );
    let d = w.drain(1 << 20, clock.at(1.0));
    let got = decode_frames(&d.frames);
    let expected = [
        ("ADDED", "x", "2"),
        ("DELETED", "x", "4"),
        ("ADDED", "x", "5"),
        ("MODIFIED", "x", "6"),
        ("DELETED", "x", "7"),
    ];
    let got: Vec<(&str, &str, &str)> = got
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(got, expected);
    // The DELETED of a transition carries the previous object (still matching labels).
    let v: serde_json::Value = serde_json::from_slice(&d.frames[1]).unwrap();
    assert_eq!(v["object"]["metadata"]["labels"]["app"], "web");
    assert!(!d.more && !d.finished);
    assert_eq!(w.synced_revision(), 8);
    assert!(w.drain(1 << 20, clock.at(1.0)).frames.is_empty());
}

#[test]
fn one_encoding_serves_a_thousand_watchers() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    let mut json: Vec<Watcher> = (0..1000)
        .map(|_| {
            c.watch(watch_req(None, sel("", ""), WatchStart::Now), clock.at(0.0))
                .unwrap()
        })
        .collect();
    let mut proto: Vec<Watcher> = (0..1000)
        .map(|_| {
            let mut r = watch_req(Some("a"), sel("", ""), WatchStart::Now);
            r.format = FrameFormat::Protobuf;
            c.watch(r, clock.at(0.0)).unwrap()
        })
        .collect();
    apply(&c, vec![put("a", "x", &[("app", "web")], 2)], clock.at(1.0));
    let frames: Vec<Bytes> = json
        .iter_mut()
        .map(|w| w.drain(1 << 20, clock.at(1.0)).frames.remove(0))
        .collect();
    assert_eq!(c.encodings(FrameFormat::Json), 1);
    assert!(
        frames.iter().all(|f| f.as_ptr() == frames[0].as_ptr()),
        "the same bytes, not copies"
    );

    let pframes: Vec<Bytes> = proto
        .iter_mut()
        .map(|w| w.drain(1 << 20, clock.at(1.0)).frames.remove(0))
        .collect();
    assert_eq!(c.encodings(FrameFormat::Protobuf), 1);
    assert!(pframes.iter().all(|f| f.as_ptr() == pframes[0].as_ptr()));
    let (ty, envelope) = decode_watch_event_protobuf(&pframes[0]).unwrap();
    assert_eq!(ty, "ADDED");
    let (tm, raw) = decode_envelope(&envelope).unwrap();
    assert_eq!(
        (tm.api_version.as_str(), tm.kind.as_str()),
        ("v1", "ServiceAccount")
    );
    let sa = <ServiceAccount as crate::codec::ProtoKind>::from_proto_bytes(&raw).unwrap();
    assert_eq!(sa.metadata.resource_version, "2");
    assert_eq!(c.stats().encoded_json, 1);
}

#[test]
fn initial_events_then_end_bookmark_then_live_events() {
    let clock = Clock::new();
    let c = cache_with(
        WatchCacheConfig {
            bookmark_interval: Duration::from_secs(10),
            ..config()
        },
        &clock,
    );
    let events = (0..20)
        .map(|i| put("a", &format!("o{i:02}"), &[], 2 + i))
        .collect();
    apply(&c, events, clock.at(0.0));
    let mut req = watch_req(
        Some("a"),
        sel("", "metadata.name!=o05"),
        WatchStart::InitialEvents { end_bookmark: true },
    );
    req.bookmarks = true;
    let mut w = c.watch(req, clock.at(0.0)).unwrap();
    assert!(
        w.final_bookmark().is_none(),
        "no bookmark before the initial events are out"
    );
    apply(&c, vec![put("a", "late", &[], 22)], clock.at(0.5));

    // A small budget splits the initial events over several drains.
    let mut frames = Vec::new();
    for _ in 0..100 {
        let d = w.drain(600, clock.at(1.0));
        assert!(d.frames.len() < 20, "the budget bounds each batch");
        frames.extend(d.frames);
        if !d.more {
            break;
        }
    }
    let got = decode_frames(&frames);
    assert_eq!(got.len(), 19 + 1 + 1);
    assert!(got[..19].iter().all(|(t, _, _)| t == "ADDED"));
    assert!(!got.iter().any(|(_, n, _)| n == "o05"));
    assert_eq!((got[19].0.as_str(), got[19].2.as_str()), ("BOOKMARK", "21"));
    let end: serde_json::Value = serde_json::from_slice(&frames[19]).unwrap();
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(end["object"]["kind"], "ServiceAccount");
    assert_eq!((got[20].0.as_str(), got[20].1.as_str()), ("ADDED", "late"));

    // Periodic bookmarks: none before they are due, then at the cache's revision.
    c.apply(FeedItem::Progress(30), clock.at(2.0));
    assert!(w.drain(1 << 20, clock.at(5.0)).frames.is_empty());
    assert_eq!(w.next_bookmark_at(), Some(clock.at(10.0)));
    let d = w.drain(1 << 20, clock.at(10.0));
    assert_eq!(
        decode_frames(&d.frames),
        [("BOOKMARK".into(), String::new(), "30".into())]
    );
    assert_eq!(w.next_bookmark_at(), Some(clock.at(20.0)));
    let before = c.encodings(FrameFormat::Json);
    let fin = w.final_bookmark().unwrap();
    assert_eq!(fin, d.frames[0], "same revision, same shared frame");
    assert_eq!(c.encodings(FrameFormat::Json), before);
}

#[test]
fn a_resumed_watch_replays_history_then_goes_live() {
    let clock = Clock::new();
    let c = cache_with(
        WatchCacheConfig {
            watcher_queue_limit: 3,
            ..config()
        },
        &clock,
    );
    apply(
        &c,
        (2..42)
            .map(|r| put("a", &format!("o{r}"), &[], r))
            .collect(),
        clock.at(0.0),
    );
    let mut w = c
        .watch(
            watch_req(None, sel("", ""), WatchStart::After(10)),
            clock.at(0.0),
        )
        .unwrap();
    assert_eq!(w.backlog(), (0, true), "walks the ring from 10");
    let mut revs = Vec::new();
    let mut drains = 0;
    for r in 42..52 {
        // Live events arrive while it catches up; its queue overflows into the interval.
        apply(&c, vec![put("b", &format!("o{r}"), &[], r)], clock.at(0.0));
        let d = w.drain(400, clock.at(0.0));
        drains += 1;
        revs.extend(decode_frames(&d.frames).into_iter().map(|(_, _, rv)| rv));
        assert!(w.backlog().0 <= 3);
    }
    while drains < 200 {
        let d = w.drain(400, clock.at(0.0));
        drains += 1;
        revs.extend(decode_frames(&d.frames).into_iter().map(|(_, _, rv)| rv));
        if !d.more {
            break;
        }
    }
    let expected: Vec<String> = (11..52).map(|r| r.to_string()).collect();
    assert_eq!(revs, expected);
    assert_eq!(w.backlog(), (0, false));
}

#[test]
fn a_stalled_watcher_ends_with_410_and_others_keep_going() {
    let clock = Clock::new();
    let cfg = WatchCacheConfig {
        watcher_queue_limit: 4,
        history_max_events: 64,
        ..config()
    };
    let c = cache_with(cfg, &clock);
    let all = sel("", "");
    let mut stalled = c
        .watch(
            watch_req(Some("a"), all.clone(), WatchStart::Now),
            clock.at(0.0),
        )
        .unwrap();
    // Never overflows (one matching event), but the ring moves past that event.
    let mut quiet = c
        .watch(
            watch_req(Some("a"), sel("slow", ""), WatchStart::Now),
            clock.at(0.0),
        )
        .unwrap();
    let mut active: Vec<Watcher> = (0..100)
        .map(|_| {
            c.watch(
                watch_req(Some("a"), all.clone(), WatchStart::Now),
                clock.at(0.0),
            )
            .unwrap()
        })
        .collect();
    let mut received = vec![0usize; active.len()];
    apply(&c, vec![put("a", "s", &[("slow", "1")], 2)], clock.at(0.0));
    let mut rev = 2;
    for _ in 0..100 {
        let batch = (0..2)
            .map(|_| {
                rev += 1;
                put("a", &format!("o{rev}"), &[], rev)
            })
            .collect();
        apply(&c, batch, clock.at(1.0));
        for (w, n) in active.iter_mut().zip(received.iter_mut()) {
            let d = w.drain(1 << 20, clock.at(1.0));
            assert!(!d.finished);
            *n += d.frames.len();
        }
        assert!(
            stalled.backlog().0 <= 4,
            "a stalled watcher holds a bounded queue"
        );
        let s = c.stats();
        assert!(s.history_events <= 64);
    }
    assert!(received.iter().all(|n| *n == 201), "{received:?}");
    // The eviction that overran it already unregistered it: ingest no longer visits it.
    assert_eq!(c.stats().watchers, 101);
    let d = stalled.drain(1 << 20, clock.at(2.0));
    assert!(d.finished);
    let last: serde_json::Value = serde_json::from_slice(d.frames.last().unwrap()).unwrap();
    assert_eq!(last["type"], "ERROR");
    assert_eq!(last["object"]["code"], 410);
    assert_eq!(last["object"]["reason"], "Expired");
    assert!(
        last["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );
    assert!(stalled.drain(1 << 20, clock.at(2.0)).frames.is_empty());

    // The quiet one is found by the next event it would have received.
    apply(
        &c,
        vec![put("a", "s", &[("slow", "2")], rev + 1)],
        clock.at(3.0),
    );
    assert_eq!(c.stats().watchers, 100);
    let d = quiet.drain(1 << 20, clock.at(3.0));
    assert!(d.finished);
    let types: Vec<String> = decode_frames(&d.frames)
        .into_iter()
        .map(|(t, _, _)| t)
        .collect();
    assert_eq!(types, ["ERROR"]);
}

#[test]
fn dispatch_visits_only_the_matching_namespace() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    let mut ws: Vec<Watcher> = (0..10_000)
        .map(|i| {
            c.watch(
                watch_req(Some(&format!("ns-{i}")), sel("", ""), WatchStart::Now),
                clock.at(0.0),
            )
            .unwrap()
        })
        .collect();
    let wakers: Vec<Arc<CountingWaker>> = (0..ws.len()).map(|_| Arc::default()).collect();
    let mut readies: Vec<Ready> = ws.iter().map(Watcher::ready).collect();
    for (r, k) in readies.iter_mut().zip(&wakers) {
        assert!(poll_once(r, k).is_pending());
    }
    let before = c.stats().dispatch_visits;
    let report = apply(&c, vec![put("ns-5", "x", &[], 2)], clock.at(1.0));
    assert_eq!(c.stats().dispatch_visits - before, 1);
    assert_eq!(report.woken, 1);
    let woken: Vec<usize> = wakers
        .iter()
        .enumerate()
        .filter(|(_, k)| k.count() > 0)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(woken, [5]);
    assert!(poll_once(&mut readies[5], &wakers[5]).is_ready());
    assert_eq!(ws[5].drain(1 << 20, clock.at(1.0)).frames.len(), 1);
    assert!(ws[6].drain(1 << 20, clock.at(1.0)).frames.is_empty());

    // Single-object watches: only the one for that name (plus namespace-wide ones).
    let named: Vec<Watcher> = (0..1000)
        .map(|i| {
            let s = sel("", &format!("metadata.name=n{i}"));
            c.watch(watch_req(Some("ns-5"), s, WatchStart::Now), clock.at(0.0))
                .unwrap()
        })
        .collect();
    let before = c.stats().dispatch_visits;
    apply(&c, vec![put("ns-5", "n7", &[], 3)], clock.at(1.0));
    assert_eq!(c.stats().dispatch_visits - before, 2);
    drop(named);
    ws.truncate(10);
    assert_eq!(c.stats().watchers, 10, "dropping a watcher unregisters it");
}

#[test]
fn a_watcher_stays_small() {
    // The per-watcher cost in the cache is the slot (shared with dispatch) plus its index
    // entries; the handle lives in the gateway's task. Heap parts (selector terms, queue)
    // are empty or tiny for an idle watcher.
    let slot = std::mem::size_of::<WatcherSlot>();
    let handle = std::mem::size_of::<Watcher>();
    assert!(slot + handle < 1024, "slot {slot} + handle {handle}");
}

#[test]
fn refusals_and_relists() {
    let clock = Clock::new();
    let c = cache_with(
        WatchCacheConfig {
            max_watchers: 2,
            ..config()
        },
        &clock,
    );
    let json_only = WatchCache::new(KindCodec::json::<ServiceAccount>(), config());
    json_only.replace(&[], 1, clock.at(0.0));
    let mut proto = watch_req(None, sel("", ""), WatchStart::Now);
    proto.format = FrameFormat::Protobuf;
    assert_eq!(
        json_only.watch(proto, clock.at(0.0)).unwrap_err().code(),
        406
    );

    let mut a = c
        .watch(watch_req(None, sel("", ""), WatchStart::Now), clock.at(0.0))
        .unwrap();
    let _b = c
        .watch(watch_req(None, sel("", ""), WatchStart::Now), clock.at(0.0))
        .unwrap();
    assert_eq!(
        c.watch(watch_req(None, sel("", ""), WatchStart::Now), clock.at(0.0))
            .unwrap_err()
            .code(),
        429
    );
    let waker = Arc::new(CountingWaker::default());
    let mut ready = a.ready();
    assert!(poll_once(&mut ready, &waker).is_pending());
    // A relist breaks the history: every watcher ends with 410 and may watch again.
    c.replace(&[sa_kv("a", "x", &[], 5)], 9, clock.at(1.0));
    assert_eq!(waker.count(), 1);
    let d = a.drain(1 << 20, clock.at(1.0));
    assert!(d.finished);
    assert_eq!(decode_frames(&d.frames)[0].0, "ERROR");
    assert_eq!(c.stats().watchers, 0);
    assert!(
        c.watch(
            watch_req(None, sel("", ""), WatchStart::After(9)),
            clock.at(1.0)
        )
        .is_ok()
    );
}

#[test]
fn a_paced_gate_wakes_one_slice_at_once_and_the_deferred_watchers_batch_their_events() {
    let clock = Clock::new();
    let gate = WakeGate::paced(8);
    let c = WatchCache::with_gate(
        KindCodec::with_protobuf::<ServiceAccount>(),
        config(),
        gate.clone(),
    );
    c.replace(&[], 1, clock.at(0.0));
    let mut ws: Vec<Watcher> = (0..100)
        .map(|_| {
            c.watch(
                watch_req(Some("a"), Selector::everything(), WatchStart::Now),
                clock.at(0.0),
            )
            .unwrap()
        })
        .collect();
    let wakers: Vec<Arc<CountingWaker>> = (0..ws.len()).map(|_| Arc::default()).collect();
    for (w, k) in ws.iter().zip(&wakers) {
        assert!(poll_once(&mut w.ready(), k).is_pending());
    }
    let woken = || wakers.iter().filter(|k| k.count() > 0).count();

    apply(&c, vec![put("a", "x", &[], 2)], clock.at(1.0));
    assert_eq!(woken(), 8, "one slice is woken at once");
    assert_eq!(gate.waiting(), 92, "the rest wait for the pacer");

    // A second event before the pacer runs: the waiting watchers are not queued twice, and
    // the woken ones that have not polled yet are not woken again.
    apply(&c, vec![put("a", "x", &[], 3)], clock.at(1.0));
    assert_eq!(gate.waiting(), 92);
    assert!(wakers.iter().all(|k| k.count() <= 1));

    let mut released = 0;
    loop {
        let n = gate.release();
        if n == 0 {
            break;
        }
        assert!(n <= 8, "a slice at a time");
        released += n;
    }
    assert_eq!(released, 92);
    assert_eq!(woken(), 100);
    assert_eq!(gate.deferred(), 92);

    // Every watcher, woken once, drains both events in one batch (one write).
    for w in &mut ws {
        let d = w.drain(1 << 20, clock.at(1.0));
        let got: Vec<String> = decode_frames(&d.frames).into_iter().map(|f| f.2).collect();
        assert_eq!(got, ["2", "3"]);
        assert!(!d.more);
    }
}

#[test]
fn a_resync_tells_watchers_the_differences_and_keeps_them() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(
        &c,
        vec![
            put("a", "same", &[], 2),
            put("a", "changed", &[], 3),
            put("a", "gone", &[], 4),
        ],
        clock.at(0.0),
    );
    let mut w = c
        .watch(
            watch_req(None, sel("", ""), WatchStart::After(4)),
            clock.at(0.0),
        )
        .unwrap();
    // A full read at 20: "changed" at 9, "new" at 12, "gone" missing.
    let report = c.resync(
        &[
            sa_kv("a", "changed", &[("v", "2")], 9),
            sa_kv("a", "new", &[], 12),
            sa_kv("a", "same", &[], 2),
        ],
        20,
        clock.at(1.0),
    );
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.applied, 3);
    let d = w.drain(1 << 20, clock.at(1.0));
    let got: Vec<(String, String)> = decode_frames(&d.frames)
        .into_iter()
        .map(|(ty, name, _)| (ty, name))
        .collect();
    assert_eq!(
        got,
        [
            ("MODIFIED".to_string(), "changed".to_string()),
            ("ADDED".into(), "new".into()),
            ("DELETED".into(), "gone".into()),
        ]
    );
    assert!(!w.is_finished(), "the watcher goes on");
    assert_eq!(c.revision(), 20);
    // A watch resumed from the last event sees nothing again; one from before sees the rest.
    let mut after = c
        .watch(
            watch_req(None, sel("", ""), WatchStart::After(12)),
            clock.at(1.0),
        )
        .unwrap();
    let d = after.drain(1 << 20, clock.at(1.0));
    let names: Vec<String> = decode_frames(&d.frames)
        .into_iter()
        .map(|(_, n, rv)| format!("{n}@{rv}"))
        .collect();
    assert_eq!(names, ["gone@20"]);
    // An older full read changes nothing.
    assert_eq!(c.resync(&[], 15, clock.at(2.0)).applied, 0);
    assert_eq!(c.revision(), 20);
}

#[test]
fn a_resync_bookmarks_every_watcher_that_takes_bookmarks_at_once() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(
        &c,
        vec![put("a", "quiet", &[], 2), put("a", "busy", &[], 3)],
        clock.at(0.0),
    );
    // Two watchers of an object the resync leaves alone: one takes bookmarks.
    let mut req = watch_req(
        Some("a"),
        sel("", "metadata.name=quiet"),
        WatchStart::After(3),
    );
    req.bookmarks = true;
    let mut marked = c.watch(req, clock.at(0.0)).unwrap();
    let mut plain = c
        .watch(
            watch_req(
                Some("a"),
                sel("", "metadata.name=quiet"),
                WatchStart::After(3),
            ),
            clock.at(0.0),
        )
        .unwrap();
    let waker = Arc::new(CountingWaker::default());
    let mut ready = marked.ready();
    assert!(poll_once(&mut ready, &waker).is_pending());
    assert!(marked.drain(1 << 20, clock.at(1.0)).frames.is_empty());

    c.resync(
        &[
            sa_kv("a", "quiet", &[], 2),
            sa_kv("a", "busy", &[("v", "2")], 7),
        ],
        20,
        clock.at(1.0),
    );
    assert_eq!(waker.count(), 1, "woken for the bookmark");
    assert!(matches!(poll_once(&mut ready, &waker), Poll::Ready(())));
    // Long before its periodic one is due, it is told the new revision.
    let d = marked.drain(1 << 20, clock.at(1.0));
    assert_eq!(
        decode_frames(&d.frames),
        [("BOOKMARK".into(), String::new(), "20".into())]
    );
    assert!(!d.more);
    assert_eq!(marked.synced_revision(), 20);
    assert_eq!(
        marked.next_bookmark_at(),
        Some(clock.at(1.0) + config().bookmark_interval),
        "the periodic bookmarks count from it"
    );
    // Once only, and never to a watcher that did not ask for bookmarks.
    assert!(marked.drain(1 << 20, clock.at(2.0)).frames.is_empty());
    let d = plain.drain(1 << 20, clock.at(1.0));
    assert!(d.frames.is_empty() && !d.more);
}

#[test]
fn a_watch_ahead_of_the_cache_skips_what_comes_up_to_its_revision() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(&c, vec![put("a", "o2", &[], 2)], clock.at(0.0));
    // Plain `After` a revision the cache has not reached is refused; `Ahead` starts.
    assert_eq!(
        c.watch(
            watch_req(None, sel("", ""), WatchStart::After(10)),
            clock.at(0.0)
        )
        .unwrap_err()
        .code(),
        504
    );
    let mut w = c
        .watch(
            watch_req(None, sel("", ""), WatchStart::Ahead(10)),
            clock.at(0.0),
        )
        .unwrap();
    assert_eq!(w.synced_revision(), 10);
    apply(
        &c,
        vec![
            put("a", "o5", &[], 5),
            put("a", "o10", &[], 10),
            put("a", "o11", &[], 11),
        ],
        clock.at(0.0),
    );
    let d = w.drain(1 << 20, clock.at(0.0));
    let got: Vec<(String, String, String)> = decode_frames(&d.frames);
    assert_eq!(got, [("ADDED".into(), "o11".into(), "11".into())]);
    // At or behind the cache, `Ahead` is `After`.
    let mut behind = c
        .watch(
            watch_req(None, sel("", ""), WatchStart::Ahead(5)),
            clock.at(0.0),
        )
        .unwrap();
    let d = behind.drain(1 << 20, clock.at(0.0));
    let names: Vec<String> = decode_frames(&d.frames).into_iter().map(|f| f.1).collect();
    assert_eq!(names, ["o10", "o11"]);
}

/// Pods described at run time (proxy mode's kind of object), for the field index.
static PODS: crate::resource::ResourceInfo = crate::resource::ResourceInfo {
    group: "",
    version: "v1",
    kind: "Pod",
    list_kind: "PodList",
    plural: "pods",
    singular: "pod",
    short_names: &[],
    scope: crate::resource::Scope::Namespaced,
    verbs: &["list", "watch"],
    name_rule: crate::validation::NameRule::PathSegment,
    extra_fields: &["spec.nodeName"],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: &[],
    columns: &[],
    schema: crate::resource::no_schema,
    subresources: &[],
    stored: true,
    expires: false,
};

fn pod(name: &str, node: &str, rev: Revision) -> Event {
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rev}"}},"spec":{{"nodeName":"{node}"}}}}"#
    );
    Event {
        kind: EventKind::Put,
        kv: KeyValue {
            key: Bytes::from(PODS.key("ns", name)),
            value: Bytes::from(json),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
        },
        prev_kv: None,
    }
}

#[test]
fn dispatch_visits_only_the_watchers_of_a_pinned_field_value() {
    let clock = Clock::new();
    let c = WatchCache::new(unstructured::codec(&PODS), config());
    c.replace(&[], 1, clock.at(0.0));
    // 5,000 kubelets, each watching the pods of its node across namespaces, and the
    // scheduler watching unscheduled pods.
    let pinned = |node: &str| {
        Selector::new(
            LabelSelector::default(),
            FieldSelector::parse(&format!("spec.nodeName={node}"), |f| f == "spec.nodeName")
                .unwrap(),
        )
    };
    let mut kubelets: Vec<Watcher> = (0..5000)
        .map(|i| {
            c.watch(
                watch_req(None, pinned(&format!("node-{i}")), WatchStart::Now),
                clock.at(0.0),
            )
            .unwrap()
        })
        .collect();
    let mut scheduler = c
        .watch(watch_req(None, pinned(""), WatchStart::Now), clock.at(0.0))
        .unwrap();
    // Created unscheduled: only the scheduler is visited.
    let before = c.stats().dispatch_visits;
    apply(&c, vec![pod("p", "", 2)], clock.at(1.0));
    assert_eq!(c.stats().dispatch_visits - before, 1);
    // Bound to node-7: the scheduler (it leaves its selector: DELETED) and node-7's kubelet.
    let before = c.stats().dispatch_visits;
    apply(&c, vec![pod("p", "node-7", 3)], clock.at(1.0));
    assert_eq!(c.stats().dispatch_visits - before, 2);
    let got = |w: &mut Watcher| -> Vec<String> {
        decode_frames(&w.drain(1 << 20, clock.at(1.0)).frames)
            .into_iter()
            .map(|(ty, name, _)| format!("{ty} {name}"))
            .collect()
    };
    assert_eq!(got(&mut scheduler), ["ADDED p", "DELETED p"]);
    assert_eq!(got(&mut kubelets[7]), ["ADDED p"]);
    assert!(got(&mut kubelets[8]).is_empty());
    // Dropped watchers leave no bucket behind.
    kubelets.clear();
    drop(scheduler);
    assert_eq!(c.stats().watchers, 0);
    let before = c.stats().dispatch_visits;
    apply(&c, vec![pod("p", "node-8", 4)], clock.at(1.0));
    assert_eq!(c.stats().dispatch_visits - before, 0);
}

#[test]
fn dispatch_never_grows_a_queue_the_watcher_walks_past_it_and_grows_its_own() {
    let clock = Clock::new();
    let c = cache_with(
        WatchCacheConfig {
            watcher_queue_limit: 64,
            ..config()
        },
        &clock,
    );
    let mut w = c
        .watch(watch_req(None, sel("", ""), WatchStart::Now), clock.at(0.0))
        .unwrap();
    let room = w.queue_room();
    assert!((QUEUE_START..64).contains(&room), "starts small: {room}");
    // Twice its room in events: the queue keeps its capacity, the rest becomes a walk.
    let n = 2 * room as i64;
    for r in 2..2 + n {
        apply(&c, vec![put("a", &format!("o{r}"), &[], r)], clock.at(0.0));
    }
    assert_eq!(w.queue_room(), room, "dispatch did not grow it");
    let (queued, walks) = w.backlog();
    assert!(
        walks && queued < room,
        "it walks the ring instead: {queued}"
    );
    let mut revs = Vec::new();
    loop {
        let d = w.drain(1 << 20, clock.at(0.0));
        revs.extend(decode_frames(&d.frames).into_iter().map(|(_, _, rv)| rv));
        if !d.more {
            break;
        }
    }
    let expected: Vec<String> = (2..2 + n).map(|r| r.to_string()).collect();
    assert_eq!(revs, expected, "every event once, in order");
    assert!(w.queue_room() >= 2 * room, "it doubled its own queue");
    // Twice the old room now fits without a walk.
    for r in 2 + n..2 + 2 * n {
        apply(&c, vec![put("a", &format!("o{r}"), &[], r)], clock.at(0.0));
    }
    assert_eq!(w.backlog(), (n as usize, false));
}

#[test]
fn the_frames_a_watcher_needs_are_encoded_before_it_drains_and_only_those() {
    let clock = Clock::new();
    let c = cache_with(config(), &clock);
    apply(&c, vec![put("a", "x", &[], 2)], clock.at(0.0));
    assert_eq!(
        c.encodings(FrameFormat::Json),
        0,
        "nobody watches: nothing encoded"
    );
    let mut w = c
        .watch(watch_req(None, sel("", ""), WatchStart::Now), clock.at(0.0))
        .unwrap();
    // A selector that turns the update into ADDED for this watcher.
    let mut proto = watch_req(None, sel("app=web", ""), WatchStart::Now);
    proto.format = FrameFormat::Protobuf;
    let mut p = c.watch(proto, clock.at(0.0)).unwrap();
    apply(&c, vec![put("a", "x", &[("app", "web")], 3)], clock.at(0.0));
    assert_eq!(c.encodings(FrameFormat::Json), 1);
    assert_eq!(c.encodings(FrameFormat::Protobuf), 1);
    assert_eq!(c.encodings(FrameFormat::CborSeq), 0);
    let d = w.drain(1 << 20, clock.at(0.0));
    assert_eq!(
        decode_frames(&d.frames),
        [("MODIFIED".to_string(), "x".to_string(), "3".to_string())]
    );
    assert_eq!(p.drain(1 << 20, clock.at(0.0)).frames.len(), 1);
    assert_eq!(
        (
            c.encodings(FrameFormat::Json),
            c.encodings(FrameFormat::Protobuf)
        ),
        (1, 1),
        "the drains found them made"
    );
}
