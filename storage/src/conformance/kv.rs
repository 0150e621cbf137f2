//! Conformance tests of the key-value contract: CAS writes, revisions, reads, compaction.

use std::collections::HashSet;

use bytes::Bytes;

use super::{Subject, ok, within};
use crate::{KeyRange, KeyValue, StoreError};

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}

pub async fn create_and_already_exists(s: &Subject) {
    let key = s.key("a");
    let kv = ok("create", s.store.create(key.clone(), b("v1")).await);
    assert_eq!(kv.key, key);
    assert_eq!(kv.value, b("v1"));
    assert_eq!(kv.version, 1);
    assert_eq!(kv.create_revision, kv.mod_revision);
    assert!(kv.mod_revision > 0);

    match s.store.create(key.clone(), b("v2")).await {
        Err(StoreError::AlreadyExists { current }) => assert_eq!(*current, kv),
        other => panic!("second create: expected AlreadyExists, got {other:?}"),
    }
    let (got, at) = ok("get", s.store.get(key, None).await);
    assert_eq!(got, Some(kv.clone()));
    assert!(at >= kv.mod_revision);
    assert!(ok("current_revision", s.store.current_revision().await) >= kv.mod_revision);
}

pub async fn health_and_current_reads(s: &Subject) {
    ok("health", s.store.health().await);
    let kv = ok("create", s.store.create(s.key("h"), b("v")).await);
    let current = ok("current_revision", s.store.current_revision().await);
    // Reading explicitly at the current revision is the same as reading "now".
    let (explicit, at) = ok(
        "get at current",
        s.store.get(kv.key.clone(), Some(current)).await,
    );
    assert_eq!(at, current);
    assert_eq!(explicit, Some(kv.clone()));
    let range = ok(
        "range at current",
        s.store.range(s.range(), Some(current), 0).await,
    );
    assert_eq!(range.revision, current);
    assert_eq!(range.kvs, vec![kv]);
    let compacted = ok("compacted_revision", s.store.compacted_revision().await);
    assert!((0..=current).contains(&compacted));
}

pub async fn update_compare_and_swap(s: &Subject) {
    let key = s.key("u");
    match s.store.update(key.clone(), b("x"), 1).await {
        Err(StoreError::NotFound) => {}
        other => panic!("update of a missing key: expected NotFound, got {other:?}"),
    }
    let v1 = ok("create", s.store.create(key.clone(), b("v1")).await);
    let v2 = ok(
        "update",
        s.store.update(key.clone(), b("v2"), v1.mod_revision).await,
    );
    assert_eq!(v2.value, b("v2"));
    assert_eq!(v2.version, 2);
    assert_eq!(v2.create_revision, v1.create_revision);
    assert!(v2.mod_revision > v1.mod_revision);

    // A stale expected revision loses and is told the current value; nothing changes.
    match s
        .store
        .update(key.clone(), b("stale"), v1.mod_revision)
        .await
    {
        Err(StoreError::Conflict { current }) => assert_eq!(*current, v2),
        other => panic!("stale update: expected Conflict, got {other:?}"),
    }
    let (got, _) = ok("get", s.store.get(key.clone(), None).await);
    assert_eq!(got, Some(v2.clone()));

    let v3 = ok(
        "update",
        s.store.update(key, b("v3"), v2.mod_revision).await,
    );
    assert_eq!(v3.version, 3);
}

pub async fn delete_with_and_without_expected(s: &Subject) {
    let key = s.key("d");
    match s.store.delete(key.clone(), None).await {
        Err(StoreError::NotFound) => {}
        other => panic!("delete of a missing key: expected NotFound, got {other:?}"),
    }
    let v1 = ok("create", s.store.create(key.clone(), b("v1")).await);
    match s
        .store
        .delete(key.clone(), Some(v1.mod_revision + 1000))
        .await
    {
        Err(StoreError::Conflict { current }) => assert_eq!(*current, v1),
        other => panic!("delete with wrong revision: expected Conflict, got {other:?}"),
    }
    let (deleted, rev) = ok(
        "delete",
        s.store.delete(key.clone(), Some(v1.mod_revision)).await,
    );
    assert_eq!(deleted, v1);
    assert!(rev > v1.mod_revision);
    assert_eq!(ok("get", s.store.get(key.clone(), None).await).0, None);
    match s.store.update(key.clone(), b("x"), v1.mod_revision).await {
        Err(StoreError::NotFound) => {}
        other => panic!("update after delete: expected NotFound, got {other:?}"),
    }

    // A new incarnation starts over at version 1; unconditional delete works.
    let again = ok("re-create", s.store.create(key.clone(), b("v2")).await);
    assert_eq!(again.version, 1);
    assert_eq!(again.create_revision, again.mod_revision);
    assert!(again.create_revision > rev);
    let (deleted, rev2) = ok("delete", s.store.delete(key.clone(), None).await);
    assert_eq!(deleted, again);
    assert!(rev2 > again.mod_revision);
    assert_eq!(ok("get", s.store.get(key, None).await).0, None);
}

pub async fn revisions_strictly_increase_across_keys(s: &Subject) {
    let mut last = ok("current_revision", s.store.current_revision().await);
    let mut kvs: Vec<KeyValue> = Vec::new();
    for i in 0..10 {
        let kv = ok(
            "create",
            s.store.create(s.key(&format!("r{i}")), b("v")).await,
        );
        assert!(
            kv.mod_revision > last,
            "revision did not increase: {} then {}",
            last,
            kv.mod_revision
        );
        last = kv.mod_revision;
        kvs.push(kv);
    }
    for kv in &kvs {
        let updated = ok(
            "update",
            s.store
                .update(kv.key.clone(), b("w"), kv.mod_revision)
                .await,
        );
        assert!(updated.mod_revision > last);
        last = updated.mod_revision;
    }
    let (_, rev) = ok("delete", s.store.delete(kvs[0].key.clone(), None).await);
    assert!(rev > last);
    assert!(ok("current_revision", s.store.current_revision().await) >= rev);
}

pub async fn reads_at_past_revisions(s: &Subject) {
    let (a, bk, c) = (s.key("p/a"), s.key("p/b"), s.key("p/c"));
    let a1 = ok("create a", s.store.create(a.clone(), b("a1")).await);
    let b1 = ok("create b", s.store.create(bk.clone(), b("b1")).await);
    let a2 = ok(
        "update a",
        s.store.update(a.clone(), b("a2"), a1.mod_revision).await,
    );
    let (_, b_deleted) = ok("delete b", s.store.delete(bk.clone(), None).await);
    let c1 = ok("create c", s.store.create(c.clone(), b("c1")).await);
    let range = s.sub_range("p/");

    let at = |rev| {
        let store = s.store.clone();
        let range = range.clone();
        async move {
            let result = ok("range at revision", store.range(range, Some(rev), 0).await);
            assert_eq!(result.revision, rev);
            result.kvs
        }
    };
    assert_eq!(at(a1.mod_revision).await, vec![a1.clone()]);
    assert_eq!(at(b1.mod_revision).await, vec![a1.clone(), b1.clone()]);
    assert_eq!(at(a2.mod_revision).await, vec![a2.clone(), b1.clone()]);
    assert_eq!(at(b_deleted).await, vec![a2.clone()]);
    assert_eq!(at(c1.mod_revision).await, vec![a2.clone(), c1.clone()]);
    if a1.mod_revision > 1 {
        let before = ok(
            "range",
            s.store
                .range(range.clone(), Some(a1.mod_revision - 1), 0)
                .await,
        );
        assert!(before.kvs.is_empty());
    }

    let get = |key: Bytes, rev| {
        let store = s.store.clone();
        async move { ok("get at revision", store.get(key, Some(rev)).await).0 }
    };
    assert_eq!(get(a.clone(), a1.mod_revision).await, Some(a1.clone()));
    assert_eq!(get(a.clone(), b1.mod_revision).await, Some(a1.clone()));
    assert_eq!(get(a.clone(), a2.mod_revision).await, Some(a2.clone()));
    assert_eq!(get(bk.clone(), a2.mod_revision).await, Some(b1.clone()));
    assert_eq!(get(bk.clone(), b_deleted).await, None);
    assert_eq!(get(c.clone(), b_deleted).await, None);
    assert_eq!(get(c, c1.mod_revision).await, Some(c1.clone()));

    let current = ok("range now", s.store.range(range, None, 0).await);
    assert_eq!(current.kvs, vec![a2, c1.clone()]);
    assert!(current.revision >= c1.mod_revision);
}

pub async fn range_limit_and_more(s: &Subject) {
    let mut created = Vec::new();
    for i in 0..5 {
        created.push(ok(
            "create",
            s.store.create(s.key(&format!("l/{i}")), b("v")).await,
        ));
    }
    let range = s.sub_range("l/");
    let all = ok("range", s.store.range(range.clone(), None, 0).await);
    assert_eq!(all.kvs, created);
    assert!(!all.more);

    let two = ok("range limit 2", s.store.range(range.clone(), None, 2).await);
    assert_eq!(two.kvs, created[..2]);
    assert!(two.more);

    let exact = ok("range limit 5", s.store.range(range.clone(), None, 5).await);
    assert_eq!(exact.kvs, created);
    assert!(!exact.more, "limit equal to the count must not report more");

    // Continue after the last key returned, at the same revision (how lists paginate).
    let mut next_start = two.kvs[1].key.to_vec();
    next_start.push(0);
    let rest = KeyRange {
        start: Bytes::from(next_start),
        end: range.end.clone(),
    };
    let page = ok(
        "second page",
        s.store.range(rest, Some(two.revision), 2).await,
    );
    assert_eq!(page.kvs, created[2..4]);
    assert!(page.more);

    // Limits apply at past revisions too.
    let past = ok(
        "range past",
        s.store.range(range, Some(created[3].mod_revision), 3).await,
    );
    assert_eq!(past.kvs, created[..3]);
    assert!(past.more);
}

pub async fn prefix_ranges_do_not_leak(s: &Subject) {
    for name in ["a", "a/1", "a/2", "ab", "ab/1", "b"] {
        ok("create", s.store.create(s.key(name), b(name)).await);
    }
    let keys = |kvs: Vec<KeyValue>| -> Vec<String> {
        kvs.into_iter()
            .map(|kv| String::from_utf8_lossy(&kv.key[s.prefix.len()..]).into_owned())
            .collect()
    };
    let under_a = ok("range a/", s.store.range(s.sub_range("a/"), None, 0).await);
    assert_eq!(keys(under_a.kvs), ["a/1", "a/2"]);
    let under_ab = ok(
        "range ab/",
        s.store.range(s.sub_range("ab/"), None, 0).await,
    );
    assert_eq!(keys(under_ab.kvs), ["ab/1"]);
    let starting_a = ok("range a", s.store.range(s.sub_range("a"), None, 0).await);
    assert_eq!(keys(starting_a.kvs), ["a", "a/1", "a/2", "ab", "ab/1"]);
    // [a, b) half-open: "b" itself is excluded.
    let explicit = KeyRange {
        start: s.key("a/"),
        end: s.key("b"),
    };
    let explicit = ok("range [a/, b)", s.store.range(explicit, None, 0).await);
    assert_eq!(keys(explicit.kvs), ["a/1", "a/2", "ab", "ab/1"]);
    let none = ok("range x/", s.store.range(s.sub_range("x/"), None, 0).await);
    assert!(none.kvs.is_empty());
    assert!(!none.more);
    // Nothing outside the subject's prefix shows up in its range.
    let mine = ok("range prefix", s.store.range(s.range(), None, 0).await);
    assert_eq!(mine.kvs.len(), 6);
}

pub async fn future_revision_is_refused(s: &Subject) {
    let kv = ok("create", s.store.create(s.key("f"), b("v")).await);
    let current = ok("current_revision", s.store.current_revision().await);
    assert!(current >= kv.mod_revision);
    let future = current + 1_000_000;
    match s.store.get(kv.key.clone(), Some(future)).await {
        Err(StoreError::FutureRevision { requested, .. }) => assert_eq!(requested, future),
        other => panic!("get in the future: expected FutureRevision, got {other:?}"),
    }
    match s.store.range(s.range(), Some(future), 0).await {
        Err(StoreError::FutureRevision { requested, .. }) => assert_eq!(requested, future),
        other => panic!("range in the future: expected FutureRevision, got {other:?}"),
    }
    match s.store.compact(future).await {
        Err(StoreError::FutureRevision { .. }) => {}
        other => panic!("compact in the future: expected FutureRevision, got {other:?}"),
    }
    // The current revision itself is readable.
    let (got, _) = ok(
        "get at current",
        s.store.get(kv.key.clone(), Some(current)).await,
    );
    assert_eq!(got, Some(kv));
}

/// Compacts the whole store.
pub async fn compaction_discards_history_keeps_state(s: &Subject) {
    let (a, bk, c) = (s.key("c/a"), s.key("c/b"), s.key("c/c"));
    let a1 = ok("create a", s.store.create(a.clone(), b("a1")).await);
    let a2 = ok(
        "update a",
        s.store.update(a.clone(), b("a2"), a1.mod_revision).await,
    );
    let b1 = ok("create b", s.store.create(bk.clone(), b("b1")).await);
    let (_, b_deleted) = ok("delete b", s.store.delete(bk.clone(), None).await);
    let c1 = ok("create c", s.store.create(c.clone(), b("c1")).await);
    let a3 = ok(
        "update a",
        s.store.update(a.clone(), b("a3"), a2.mod_revision).await,
    );
    let point = c1.mod_revision;

    ok("compact", s.store.compact(point).await);
    assert!(ok("compacted_revision", s.store.compacted_revision().await) >= point);

    for rev in [a1.mod_revision, a2.mod_revision, b1.mod_revision, b_deleted] {
        match s.store.get(a.clone(), Some(rev)).await {
            Err(StoreError::Compacted {
                requested,
                compacted,
            }) => {
                assert_eq!(requested, rev);
                assert!(compacted >= point);
            }
            other => panic!("get at compacted revision {rev}: expected Compacted, got {other:?}"),
        }
        match s.store.range(s.range(), Some(rev), 0).await {
            Err(StoreError::Compacted { .. }) => {}
            other => panic!("range at compacted revision {rev}: expected Compacted, got {other:?}"),
        }
    }
    // The state as of the compaction point survives, and so does everything after it.
    let at_point = ok(
        "range at compaction point",
        s.store.range(s.range(), Some(point), 0).await,
    );
    assert_eq!(at_point.kvs, vec![a2.clone(), c1.clone()]);
    assert_eq!(
        ok("get a", s.store.get(a.clone(), Some(point)).await).0,
        Some(a2)
    );
    assert_eq!(ok("get b", s.store.get(bk, Some(point)).await).0, None);
    let now = ok("range now", s.store.range(s.range(), None, 0).await);
    assert_eq!(now.kvs, vec![a3.clone(), c1]);

    // Compacting at or below the compaction point again succeeds and changes nothing.
    ok("compact again", s.store.compact(point).await);
    ok("compact lower", s.store.compact(a1.mod_revision).await);
    let a4 = ok(
        "update after compaction",
        s.store.update(a, b("a4"), a3.mod_revision).await,
    );
    assert!(a4.mod_revision > a3.mod_revision);
}

/// 64 tasks × 50 writes; every acknowledged write has its own revision.
pub async fn concurrent_writers_get_unique_revisions(s: &Subject) {
    let revisions = super::watch::concurrent_writes(s, "cw", 64, 50).await;
    let unique: HashSet<_> = revisions.iter().map(|(_, rev)| *rev).collect();
    assert_eq!(
        unique.len(),
        revisions.len(),
        "two writes were acknowledged with one revision"
    );
    let result = within("range", s.store.range(s.sub_range("cw/"), None, 0)).await;
    let result = ok("range", result);
    assert_eq!(result.kvs.len(), 64);
    for kv in &result.kvs {
        assert_eq!(kv.version, 50);
    }
}
