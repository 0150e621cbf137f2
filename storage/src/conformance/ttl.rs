//! Conformance tests of keys with a time to live: they go by themselves, as revisioned deletes
//! every feed reports, never before their time; the latest write decides a key's time to live.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

use super::{Subject, assert_ordered, ok, within};
use crate::{Event, EventKind, FeedItem, FeedStream, Revision};

/// Short enough for a test, long enough for etcd (whose leases last at least a second).
const TTL: Duration = Duration::from_secs(2);

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}

/// Reads the feed until a `Delete` of every key in `keys` arrived; returns every event read.
async fn until_deleted(feed: &mut FeedStream, keys: &[&Bytes]) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    let gone = |events: &[Event]| {
        keys.iter().all(|k| {
            events
                .iter()
                .any(|e| e.kind == EventKind::Delete && e.kv.key == **k)
        })
    };
    within("the expiry of keys with a time to live", async {
        while !gone(&events) {
            match feed.next().await {
                Some(Ok(FeedItem::Events(batch))) => events.extend(batch),
                Some(Ok(FeedItem::Progress(_))) => {}
                Some(Err(err)) => panic!("feed failed: {err}"),
                None => panic!("feed ended before the keys expired"),
            }
        }
    })
    .await;
    assert_ordered(&events);
    events
}

fn deletes_of<'a>(events: &'a [Event], key: &Bytes) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::Delete && e.kv.key == *key)
        .collect()
}

pub async fn ttl_keys_expire_with_a_delete_event(s: &Subject) {
    let key = s.key("ttl/a");
    let plain = s.key("ttl/plain");
    let before: Revision = ok("current_revision", s.store.current_revision().await);
    let kept = ok("create plain", s.store.create(plain.clone(), b("p")).await);
    let asked = Instant::now();
    let kv = ok(
        "create_with_ttl",
        s.store.create_with_ttl(key.clone(), b("v"), TTL).await,
    );
    assert_eq!((kv.version, kv.create_revision), (1, kv.mod_revision));
    assert!(kv.mod_revision > kept.mod_revision);
    match s.store.create_with_ttl(key.clone(), b("again"), TTL).await {
        Err(crate::StoreError::AlreadyExists { current }) => assert_eq!(*current, kv),
        other => panic!("second create_with_ttl: expected AlreadyExists, got {other:?}"),
    }

    let mut feed = s.store.watch(s.sub_range("ttl/"), kv.mod_revision);
    let events = until_deleted(&mut feed, &[&key]).await;
    assert!(
        asked.elapsed() >= TTL,
        "expired after {:?}, before its time to live of {TTL:?}",
        asked.elapsed()
    );
    let deletes = deletes_of(&events, &key);
    assert_eq!(deletes.len(), 1, "{events:?}");
    let deleted = deletes[0];
    assert!(deleted.revision() > kv.mod_revision);
    assert_eq!(deleted.prev_kv.as_ref(), Some(&kv));
    assert_eq!((deleted.kv.value.len(), deleted.kv.version), (0, 0));

    let (now, at) = ok("get expired", s.store.get(key.clone(), None).await);
    assert_eq!(now, None);
    assert!(at >= deleted.revision());
    let (other, _) = ok("get plain", s.store.get(plain.clone(), None).await);
    assert_eq!(other, Some(kept.clone()), "a key without a TTL went too");
    // History stays consistent: the key is there just before its delete, and a feed
    // replayed from before the writes reports the create and then the delete.
    let (then, _) = ok(
        "get before the expiry",
        s.store.get(key.clone(), Some(deleted.revision() - 1)).await,
    );
    assert_eq!(then, Some(kv.clone()));
    let mut replay = s.store.watch(s.sub_range("ttl/"), before);
    let replayed = super::events_until(&mut replay, deleted.revision()).await;
    let kinds: Vec<(EventKind, Revision)> =
        replayed.iter().map(|e| (e.kind, e.revision())).collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Put, kept.mod_revision),
            (EventKind::Put, kv.mod_revision),
            (EventKind::Delete, deleted.revision()),
        ]
    );
}

pub async fn ttl_follows_the_latest_write(s: &Subject) {
    let longer = TTL + Duration::from_secs(4);
    let start: Revision = ok("current_revision", s.store.current_revision().await);
    // a: a TTL, then a plain update, which removes it.
    let a = s.key("ttl2/a");
    let a1 = ok(
        "create a",
        s.store.create_with_ttl(a.clone(), b("a1"), TTL).await,
    );
    let a2 = ok(
        "update a",
        s.store.update(a.clone(), b("a2"), a1.mod_revision).await,
    );
    // b: no TTL, then an update that gives it one.
    let bk = s.key("ttl2/b");
    let b1 = ok("create b", s.store.create(bk.clone(), b("b1")).await);
    let b2 = ok(
        "update b",
        s.store
            .update_with_ttl(bk.clone(), b("b2"), b1.mod_revision, TTL)
            .await,
    );
    assert_eq!((b2.version, b2.create_revision), (2, b1.create_revision));
    // c: a TTL, then an update with a longer one, which counts from the update.
    let c = s.key("ttl2/c");
    let c1 = ok(
        "create c",
        s.store.create_with_ttl(c.clone(), b("c1"), TTL).await,
    );
    let c2 = ok(
        "update c",
        s.store
            .update_with_ttl(c.clone(), b("c2"), c1.mod_revision, longer)
            .await,
    );
    // d: a TTL, deleted, created again without one: the old TTL does not carry over.
    let d = s.key("ttl2/d");
    let d1 = ok(
        "create d",
        s.store.create_with_ttl(d.clone(), b("d1"), TTL).await,
    );
    ok(
        "delete d",
        s.store.delete(d.clone(), Some(d1.mod_revision)).await,
    );
    let d2 = ok("re-create d", s.store.create(d.clone(), b("d2")).await);
    // A sentinel written last: by the time it has expired, every TTL given above except
    // c's longer one has passed.
    let sentinel = s.key("ttl2/sentinel");
    ok(
        "create sentinel",
        s.store.create_with_ttl(sentinel.clone(), b("s"), TTL).await,
    );

    let mut feed = s.store.watch(s.sub_range("ttl2/"), start);
    let events = until_deleted(&mut feed, &[&sentinel, &bk]).await;
    for (name, key, value) in [("a", &a, &a2), ("c", &c, &c2), ("d", &d, &d2)] {
        let (got, _) = ok("get", s.store.get(key.clone(), None).await);
        assert_eq!(got.as_ref(), Some(value), "{name} is gone early");
    }
    assert_eq!(deletes_of(&events, &a), Vec::<&Event>::new());
    assert_eq!(deletes_of(&events, &c), Vec::<&Event>::new());
    // d's explicit delete is the only one it gets.
    assert_eq!(deletes_of(&events, &d).len(), 1);
    let b_deleted = deletes_of(&events, &bk);
    assert_eq!(b_deleted[0].prev_kv.as_ref(), Some(&b2));

    // c goes once its longer TTL has passed; a and d stay.
    let later = until_deleted(&mut feed, &[&c]).await;
    assert_eq!(deletes_of(&later, &c)[0].prev_kv.as_ref(), Some(&c2));
    assert_eq!(deletes_of(&later, &a), Vec::<&Event>::new());
    assert_eq!(deletes_of(&later, &d), Vec::<&Event>::new());
    let (a_now, _) = ok("get a", s.store.get(a, None).await);
    assert_eq!(a_now, Some(a2));
    let (d_now, _) = ok("get d", s.store.get(d, None).await);
    assert_eq!(d_now, Some(d2));
}
