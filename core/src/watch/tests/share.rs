//! Unit tests of watch sharing: [`Watcher::share_key`], [`Watcher::absorb`] (one watcher
//! serving the stream of another that is the same watch at the same place) and
//! [`Watcher::fork`] (a watcher of the same watch going on from where another has drained).
use super::*;

fn cache(clock: &Clock) -> WatchCache {
    cache_with(config(), clock)
}

/// One event per revision in `revs`, objects `o<rev>` in `ns`, applied one at a time.
fn apply(c: &WatchCache, ns: &str, revs: std::ops::RangeInclusive<Revision>, now: Instant) {
    for rev in revs {
        let r = c.apply(
            FeedItem::Events(vec![put(ns, &format!("o{rev}"), &[], rev)]),
            now,
        );
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }
}

fn req(ns: Option<&str>, start: WatchStart) -> WatchRequest {
    watch_req(ns, sel("", ""), start)
}

fn watch(c: &WatchCache, ns: &str, start: WatchStart, clock: &Clock) -> Watcher {
    c.watch(req(Some(ns), start), clock.at(0.0)).unwrap()
}

/// The `(type, resourceVersion)` of each JSON frame.
fn decode(frames: &[Bytes]) -> Vec<(String, String)> {
    frames
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            let rv = &v["object"]["metadata"]["resourceVersion"];
            (
                v["type"].as_str().unwrap_or_default().to_string(),
                rv.as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Everything `w` has ready now, in one drain (asserted: nothing more, not finished).
fn drain_all(w: &mut Watcher, clock: &Clock) -> Vec<Bytes> {
    let d = w.drain(1 << 20, clock.at(0.0));
    assert!(!d.more && !d.finished, "{d:?}");
    d.frames
}

/// The resourceVersions of the `ADDED` frames `w` drains now (and only such frames).
fn drained_revs(w: &mut Watcher, clock: &Clock) -> Vec<String> {
    decode(&drain_all(w, clock))
        .into_iter()
        .map(|(ty, rv)| {
            assert_eq!(ty, "ADDED");
            rv
        })
        .collect()
}

/// The resourceVersions of `frames`.
fn drained_revs_of(frames: &[Bytes]) -> Vec<String> {
    decode(frames).into_iter().map(|(_, rv)| rv).collect()
}

fn revs(range: std::ops::RangeInclusive<Revision>) -> Vec<String> {
    range.map(|r| r.to_string()).collect()
}

/// `a.absorb(b)` refused: both still serve their own streams, `a` returned first.
fn refused(a: &mut Watcher, b: Watcher, why: &str) -> Watcher {
    match a.absorb(b) {
        Ok(()) => panic!("absorbed although {why}"),
        Err(b) => b,
    }
}

#[test]
fn two_watches_started_now_share_and_the_survivor_serves_every_event_once() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    let b = watch(&c, "a", WatchStart::Now, &clock);
    assert!(a.share_key().is_some());
    assert_eq!(a.share_key(), b.share_key());
    assert_eq!(c.stats().watchers, 2);

    a.absorb(b).unwrap();
    assert_eq!(c.stats().watchers, 1, "the absorbed one is unregistered");
    assert_eq!(a.synced_revision(), 1);

    apply(&c, "a", 2..=6, clock.at(0.0));
    let frames = drain_all(&mut a, &clock);
    assert_eq!(frames.len(), 5);
    assert_eq!(drained_revs_of(&frames), revs(2..=6));
    assert_eq!(a.synced_revision(), 6);
    assert!(drain_all(&mut a, &clock).is_empty());
    assert_eq!(c.stats().watchers, 1);
}

#[test]
fn absorb_takes_the_later_revision() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    // Events the watch is not about: neither queues anything, but `b` starts later.
    apply(&c, "b", 2..=3, clock.at(0.0));
    let b = watch(&c, "a", WatchStart::Now, &clock);
    assert_eq!((a.synced_revision(), b.synced_revision()), (1, 3));
    a.absorb(b).unwrap();
    assert_eq!(a.synced_revision(), 3);
}

#[test]
fn absorb_refuses_another_namespace() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    let b = watch(&c, "b", WatchStart::Now, &clock);
    assert_ne!(a.share_key(), b.share_key());
    let mut b = refused(&mut a, b, "the namespaces differ");
    assert_eq!(c.stats().watchers, 2);
    apply(&c, "a", 2..=3, clock.at(0.0));
    apply(&c, "b", 4..=4, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=3));
    assert_eq!(drained_revs(&mut b, &clock), revs(4..=4));
}

#[test]
fn absorb_refuses_another_cache() {
    let clock = Clock::new();
    let c = cache(&clock);
    let d = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    let b = watch(&d, "a", WatchStart::Now, &clock);
    assert_ne!(a.share_key(), b.share_key());
    let mut b = refused(&mut a, b, "the caches differ");
    apply(&c, "a", 2..=2, clock.at(0.0));
    apply(&d, "a", 2..=3, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=2));
    assert_eq!(drained_revs(&mut b, &clock), revs(2..=3));
}

#[test]
fn absorb_refuses_another_format() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    let b = c
        .watch(
            WatchRequest {
                format: FrameFormat::Protobuf,
                ..req(Some("a"), WatchStart::Now)
            },
            clock.at(0.0),
        )
        .unwrap();
    assert_ne!(a.share_key(), b.share_key());
    let mut b = refused(&mut a, b, "the formats differ");
    assert_eq!(c.stats().watchers, 2);
    apply(&c, "a", 2..=4, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=4));
    let frames = drain_all(&mut b, &clock);
    assert_eq!(frames.len(), 3);
    assert!(
        frames.iter().all(|f| f.first() != Some(&b'{')),
        "protobuf frames, not JSON"
    );
    assert_eq!(b.synced_revision(), 4);
}

#[test]
fn absorb_refuses_another_bookmarks_flag() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    let b = c
        .watch(
            WatchRequest {
                bookmarks: true,
                ..req(Some("a"), WatchStart::Now)
            },
            clock.at(0.0),
        )
        .unwrap();
    assert_ne!(a.share_key(), b.share_key());
    let mut b = refused(&mut a, b, "only one takes bookmarks");
    // And the other way round.
    let mut a = refused(&mut b, a, "only one takes bookmarks");
    apply(&c, "a", 2..=3, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=3));
    assert_eq!(drained_revs(&mut b, &clock), revs(2..=3));
    assert!(b.next_bookmark_at().is_some() && a.next_bookmark_at().is_none());
}

#[test]
fn absorb_refuses_a_watcher_at_another_place() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    apply(&c, "a", 2..=2, clock.at(0.0));
    // `b` starts after the event `a` has queued: the same watch, not at the same place.
    let b = watch(&c, "a", WatchStart::Now, &clock);
    assert_eq!(a.share_key(), b.share_key(), "the same watch");
    let b = refused(&mut a, b, "a has an event queued that b has not");
    // Neither way round.
    let mut a = {
        let mut b = b;
        let a = refused(&mut b, a, "a has an event queued that b has not");
        apply(&c, "a", 3..=3, clock.at(0.0));
        // Queues [2, 3] and [3]: still not the same place.
        let a = refused(&mut b, a, "the queues differ");
        assert_eq!(drained_revs(&mut b, &clock), revs(3..=3));
        assert_eq!(c.stats().watchers, 2);
        a
    };
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=3));
}

#[test]
fn absorb_refuses_a_watcher_with_initial_events_left() {
    let clock = Clock::new();
    let c = cache(&clock);
    apply(&c, "a", 2..=3, clock.at(0.0));
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    let init = watch(
        &c,
        "a",
        WatchStart::InitialEvents {
            end_bookmark: false,
        },
        &clock,
    );
    assert!(a.share_key().is_some());
    assert_eq!(init.share_key(), None, "initial events left");
    let mut init = refused(&mut a, init, "b has initial events left");
    let mut a = refused(&mut init, a, "self has initial events left");
    assert_eq!(c.stats().watchers, 2);

    // Both still serve their streams: the initial events, then the live ones.
    let d = init.drain(1 << 20, clock.at(0.0));
    assert!(!d.finished);
    assert_eq!(drained_revs_of(&d.frames), revs(2..=3));
    assert!(drain_all(&mut a, &clock).is_empty());
    apply(&c, "a", 4..=4, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(4..=4));
    assert_eq!(drained_revs(&mut init, &clock), revs(4..=4));
    // Once its initial events are sent, it is the same watch at the same place.
    assert_eq!(init.share_key(), a.share_key());
    a.absorb(init).unwrap();
    assert_eq!(c.stats().watchers, 1);
}

#[test]
fn absorb_refuses_a_watcher_that_owes_a_bookmark() {
    let clock = Clock::new();
    let c = cache(&clock);
    let marked = |c: &WatchCache| {
        c.watch(
            WatchRequest {
                bookmarks: true,
                ..req(Some("a"), WatchStart::Now)
            },
            clock.at(0.0),
        )
        .unwrap()
    };
    let mut a = marked(&c);
    let b = marked(&c);
    assert_eq!(a.share_key(), b.share_key());
    // A resync owes every watcher that takes bookmarks one at the new revision.
    c.resync(&[], 20, clock.at(1.0));
    assert_eq!(
        decode(&drain_all(&mut a, &clock)),
        [("BOOKMARK".into(), "20".into())]
    );
    let mut b = refused(&mut a, b, "b owes a bookmark a has given");
    assert_eq!(
        decode(&drain_all(&mut b, &clock)),
        [("BOOKMARK".into(), "20".into())]
    );
    a.absorb(b).unwrap();
    assert_eq!(a.synced_revision(), 20);
}

#[test]
fn watchers_with_the_same_events_queued_share_and_the_survivor_drains_them_once() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    apply(&c, "a", 2..=3, clock.at(0.0));
    let mut b = watch(&c, "a", WatchStart::After(1), &clock);
    // Both drain to empty (`b` walks the ring from 1 first)...
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=3));
    assert_eq!(drained_revs(&mut b, &clock), revs(2..=3));
    // ...then both get the same events, queued, not drained.
    apply(&c, "a", 4..=6, clock.at(0.0));
    apply(&c, "b", 7..=7, clock.at(0.0));
    assert_eq!(a.share_key(), b.share_key());
    a.absorb(b).unwrap();
    assert_eq!(c.stats().watchers, 1);
    assert_eq!(drained_revs(&mut a, &clock), revs(4..=6));
    assert!(drain_all(&mut a, &clock).is_empty());
    assert_eq!(a.synced_revision(), 7);
}

#[test]
fn a_fork_gets_every_event_after_what_its_origin_drained() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    apply(&c, "a", 2..=5, clock.at(0.0));
    apply(&c, "b", 6..=6, clock.at(0.0));
    // One frame at a time: `a` stops after revision 2, with 3..5 still queued.
    let d = a.drain(1, clock.at(0.0));
    assert!(d.more);
    assert_eq!(drained_revs_of(&d.frames), revs(2..=2));
    assert_eq!(a.synced_revision(), 2);

    let mut f = a.fork(clock.at(0.0)).unwrap();
    assert_eq!(c.stats().watchers, 2);
    apply(&c, "a", 7..=8, clock.at(0.0));
    apply(&c, "b", 9..=9, clock.at(0.0));
    // The fork walks the ring from 2, then goes live; the same namespace only.
    let mut got = Vec::new();
    for _ in 0..10 {
        let d = f.drain(1 << 20, clock.at(0.0));
        assert!(!d.finished);
        got.extend(drained_revs_of(&d.frames));
        if !d.more {
            break;
        }
    }
    let expected = ["3", "4", "5", "7", "8"];
    assert_eq!(got, expected);
    assert_eq!(f.synced_revision(), 9);
    // The origin drains its own, unchanged by the fork.
    assert_eq!(drained_revs(&mut a, &clock), expected);
    assert_eq!(a.synced_revision(), 9);

    // Both drained to the same place: the same watch again, so one takes the other back.
    assert_eq!(a.share_key(), f.share_key());
    a.absorb(f).unwrap();
    assert_eq!(c.stats().watchers, 1);
    apply(&c, "a", 10..=10, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(10..=10));
}

#[test]
fn a_fork_of_a_caught_up_watcher_starts_live() {
    let clock = Clock::new();
    let c = cache(&clock);
    let mut a = watch(&c, "a", WatchStart::Now, &clock);
    apply(&c, "a", 2..=3, clock.at(0.0));
    assert_eq!(drained_revs(&mut a, &clock), revs(2..=3));
    let mut f = a.fork(clock.at(0.0)).unwrap();
    assert_eq!(f.synced_revision(), 3);
    assert_eq!(f.share_key(), a.share_key());
    assert!(drain_all(&mut f, &clock).is_empty());
    apply(&c, "a", 4..=5, clock.at(0.0));
    assert_eq!(drained_revs(&mut f, &clock), revs(4..=5));
    assert_eq!(drained_revs(&mut a, &clock), revs(4..=5));
    // Dropping the fork leaves the origin registered.
    drop(f);
    assert_eq!(c.stats().watchers, 1);
}

#[test]
fn a_fork_keeps_the_format_and_bookmarks() {
    let clock = Clock::new();
    let c = cache(&clock);
    let a = c
        .watch(
            WatchRequest {
                bookmarks: true,
                format: FrameFormat::Protobuf,
                ..req(Some("a"), WatchStart::Now)
            },
            clock.at(0.0),
        )
        .unwrap();
    let mut f = a.fork(clock.at(0.0)).unwrap();
    assert_eq!(f.format(), FrameFormat::Protobuf);
    assert!(f.next_bookmark_at().is_some());
    assert_eq!(f.share_key(), a.share_key());
    apply(&c, "a", 2..=3, clock.at(0.0));
    apply(&c, "b", 4..=4, clock.at(0.0));
    let frames = drain_all(&mut f, &clock);
    assert_eq!(frames.len(), 2);
    assert!(frames.iter().all(|f| f.first() != Some(&b'{')));
}

#[test]
fn a_fork_from_past_the_ring_is_410_and_past_max_watchers_429() {
    let clock = Clock::new();
    let c = cache_with(
        WatchCacheConfig {
            history_max_events: 4,
            ..WatchCacheConfig::default()
        },
        &clock,
    );
    let mut stalled = watch(&c, "a", WatchStart::Now, &clock);
    apply(&c, "a", 2..=12, clock.at(0.0));
    assert!(c.stats().oldest_revision > stalled.synced_revision());
    let err = stalled.fork(clock.at(0.0)).unwrap_err();
    assert_eq!(err.code(), 410, "{err:?}");
    assert!(
        matches!(err, crate::status::ApiError::Expired(_)),
        "{err:?}"
    );
    // The origin itself ends the same way.
    let d = stalled.drain(1 << 20, clock.at(0.0));
    assert!(d.finished);
    let last: serde_json::Value = serde_json::from_slice(d.frames.last().unwrap()).unwrap();
    assert_eq!(
        (last["type"].as_str(), last["object"]["code"].as_i64()),
        (Some("ERROR"), Some(410))
    );
    assert_eq!(stalled.share_key(), None, "finished");

    let c = cache_with(
        WatchCacheConfig {
            max_watchers: 1,
            ..WatchCacheConfig::default()
        },
        &clock,
    );
    let a = watch(&c, "a", WatchStart::Now, &clock);
    assert_eq!(a.fork(clock.at(0.0)).unwrap_err().code(), 429);
    assert_eq!(c.stats().watchers, 1);
}
