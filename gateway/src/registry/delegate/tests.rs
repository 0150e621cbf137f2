//! The decision, row by row of its table.
// Test code: a panic on a broken expectation is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use bytes::Bytes;
use svc_core::watch::{WatchCache, WatchCacheConfig, unstructured};
use svc_storage::{Event, EventKind, FeedItem};

use super::*;
use crate::base::query::Query;
use crate::outbound::upstream::discovery::core_kind;
use crate::outbound::upstream::watch::key_value;
use crate::registry::caches::upstream::STORM_LISTS;

/// A cache of ConfigMaps at revision 10, its history reaching back to 5.
fn configmaps() -> UpstreamCache {
    let info = core_kind("configmaps", "ConfigMap", true);
    let cache = WatchCache::new(unstructured::codec(info), WatchCacheConfig::default());
    cache.replace(&[], 5, Instant::now());
    let kv = key_value(
        info,
        Bytes::from_static(br#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"10"}}"#),
    )
    .unwrap();
    cache.apply(
        FeedItem::Events(vec![Event {
            kind: EventKind::Put,
            kv,
            prev_kv: None,
        }]),
        Instant::now(),
    );
    UpstreamCache::new(info, cache).0
}

fn opts(query: &str) -> ListOptions {
    ListOptions::from_query(&Query::parse(Some(query))).unwrap()
}

fn decided(cached: &UpstreamCache, query: &str, namespace: &str, reached: Revision) -> String {
    let o = opts(query);
    let read = Read {
        opts: &o,
        token: None,
        namespace,
        pinned: query.contains("metadata.name%3Da").then_some("a"),
    };
    match decide(&read, cached, || reached) {
        Delegation::Upstream | Delegation::Passing(_) => "upstream".into(),
        Delegation::UpstreamOrGone(e) => format!("upstream or {e}"),
        Delegation::Cache(p) => format!(
            "cache {:?} reach {:?} start {:?}",
            p.proof, p.reach, p.start
        ),
    }
}

#[test]
fn each_row_of_the_table() {
    let c = configmaps();
    let rows: &[(&str, &str, Revision, &str)] = &[
        // Lists.
        (
            "resourceVersion=0",
            "",
            10,
            "cache None reach None start None",
        ),
        (
            "resourceVersion=8&resourceVersionMatch=NotOlderThan",
            "",
            10,
            "cache None reach Some(8) start None",
        ),
        (
            "resourceVersion=12&resourceVersionMatch=Exact",
            "",
            10,
            "cache None reach Some(12) start None",
        ),
        ("", "", 10, "upstream"),
        ("resourceVersion=x", "", 10, "upstream"),
        // Watches.
        (
            "watch=1&resourceVersion=0",
            "",
            10,
            "cache None reach None start Some(InitialEvents { end_bookmark: false })",
        ),
        // A version the upstream is known to have reached starts at once (the cache's
        // own events up to it skipped).
        (
            "watch=1&resourceVersion=7",
            "",
            10,
            "cache None reach None start Some(Ahead(7))",
        ),
        (
            "watch=1&resourceVersion=7&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            "",
            10,
            "cache None reach Some(7) start Some(InitialEvents { end_bookmark: true })",
        ),
        // Past this cache, but another cache has seen the upstream there: at once.
        (
            "watch=1&resourceVersion=14",
            "",
            20,
            "cache None reach None start Some(Ahead(14))",
        ),
        // Past what any cache has seen: the cache must reach it first.
        (
            "watch=1&resourceVersion=30",
            "",
            20,
            "cache None reach Some(30) start Some(After(30))",
        ),
        (
            "watch=1&resourceVersion=3",
            "",
            10,
            "upstream or too old resource version: 3 (4)",
        ),
        ("watch=1", "", 10, "upstream"),
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            "",
            10,
            "cache Some(Whole) reach None start Some(InitialEvents { end_bookmark: true })",
        ),
        // A kubelet's informer of one ConfigMap: proven for that object alone.
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&fieldSelector=metadata.name%3Da",
            "ns",
            10,
            "cache Some(Object(\"a\")) reach None start Some(InitialEvents { end_bookmark: false })",
        ),
        // The same name across all namespaces is not one object.
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&fieldSelector=metadata.name%3Da",
            "",
            10,
            "cache Some(Whole) reach None start Some(InitialEvents { end_bookmark: false })",
        ),
    ];
    for (query, namespace, reached, want) in rows {
        assert_eq!(
            decided(&c, query, namespace, *reached),
            *want,
            "{query} in {namespace:?}"
        );
    }
}

#[test]
fn consistent_lists_go_upstream_until_a_storm_shares_one_proof() {
    let c = configmaps();
    let answers: Vec<String> = (0..=STORM_LISTS).map(|_| decided(&c, "", "", 10)).collect();
    assert!(
        answers[..STORM_LISTS as usize]
            .iter()
            .all(|a| a == "upstream")
    );
    assert_eq!(
        answers[STORM_LISTS as usize],
        "cache Some(Whole) reach None start None"
    );
}

#[test]
fn a_continue_token_of_this_proxy_reads_its_revision() {
    let c = configmaps();
    let token = crate::registry::list::decode_token(
        &crate::registry::list::encode_token(9, b"a", crate::registry::list::unix_now()),
        std::time::Duration::from_secs(300),
    )
    .unwrap();
    let o = opts("limit=1");
    let read = Read {
        opts: &o,
        token: Some(&token),
        namespace: "",
        pinned: None,
    };
    let Delegation::Cache(plan) = decide(&read, &c, || 10) else {
        panic!("not the cache's");
    };
    assert_eq!(
        plan,
        Plan {
            proof: None,
            reach: Some(9),
            start: None
        }
    );
}
