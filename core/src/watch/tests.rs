//! Unit tests of the watch cache, deterministic: time is an `Instant` the tests move by hand.
//! Shared fixtures here; state, lists and history in `tests/state.rs`, watchers and fan-out
//! in `tests/watchers.rs`, one watcher serving another's stream in `tests/share.rs`.
// Test code: arithmetic on fixtures is checked by the assertions.
#![allow(clippy::arithmetic_side_effects)]

mod share;
mod state;
mod watchers;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use svc_storage::{Event, EventKind, FeedItem, KeyValue, Revision};

use super::*;
use crate::kinds::ServiceAccount;
use crate::object::encode_for_store;
use crate::resource::Resource;
use crate::selector::{FieldSelector, LabelSelector};

/// A clock for tests: a fixed origin plus an offset moved by hand.
struct Clock(Instant);

impl Clock {
    fn new() -> Self {
        Clock(Instant::now())
    }
    fn at(&self, secs: f64) -> Instant {
        self.0 + Duration::from_secs_f64(secs)
    }
}

fn sa_key(ns: &str, name: &str) -> Bytes {
    Bytes::from(ServiceAccount::INFO.key(ns, name))
}

fn sa_kv(ns: &str, name: &str, labels: &[(&str, &str)], rev: Revision) -> KeyValue {
    let mut sa = ServiceAccount::default();
    sa.metadata.name = name.into();
    sa.metadata.namespace = ns.into();
    sa.metadata.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    KeyValue {
        key: sa_key(ns, name),
        value: Bytes::from(encode_for_store(&sa).unwrap()),
        create_revision: rev,
        mod_revision: rev,
        version: 1,
    }
}

fn put(ns: &str, name: &str, labels: &[(&str, &str)], rev: Revision) -> Event {
    Event {
        kind: EventKind::Put,
        kv: sa_kv(ns, name, labels, rev),
        prev_kv: None,
    }
}

fn del(ns: &str, name: &str, rev: Revision) -> Event {
    Event {
        kind: EventKind::Delete,
        kv: KeyValue {
            key: sa_key(ns, name),
            value: Bytes::new(),
            create_revision: 0,
            mod_revision: rev,
            version: 0,
        },
        prev_kv: None,
    }
}

fn config() -> WatchCacheConfig {
    WatchCacheConfig::default()
}

/// A ready, empty ServiceAccount cache at revision 1.
fn cache_with(config: WatchCacheConfig, clock: &Clock) -> WatchCache {
    let c = WatchCache::new(KindCodec::with_protobuf::<ServiceAccount>(), config);
    c.replace(&[], 1, clock.at(0.0));
    c
}

fn apply(c: &WatchCache, events: Vec<Event>, now: Instant) -> ApplyReport {
    let r = c.apply(FeedItem::Events(events), now);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    r
}

fn sel(labels: &str, fields: &str) -> Selector {
    Selector::new(
        LabelSelector::parse(labels).unwrap(),
        FieldSelector::parse(fields, |f| f.starts_with("metadata.")).unwrap(),
    )
}

fn names(items: &[Arc<CachedObject>]) -> Vec<String> {
    items
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect()
}

fn watch_req(ns: Option<&str>, selector: Selector, start: WatchStart) -> WatchRequest {
    WatchRequest {
        namespace: ns.map(Into::into),
        selector,
        start,
        bookmarks: false,
        format: FrameFormat::Json,
    }
}

/// The `(type, name, resourceVersion)` of each JSON frame.
fn decode_frames(frames: &[Bytes]) -> Vec<(String, String, String)> {
    frames
        .iter()
        .map(|f| {
            assert_eq!(f.last(), Some(&b'\n'), "a JSON frame is one line");
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            let meta = &v["object"]["metadata"];
            (
                v["type"].as_str().unwrap_or_default().to_string(),
                meta["name"].as_str().unwrap_or_default().to_string(),
                meta["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Polls a future once with `waker`.
fn poll_once<F: std::future::Future + Unpin>(
    f: &mut F,
    waker: &Arc<CountingWaker>,
) -> Poll<F::Output> {
    let waker = Waker::from(waker.clone());
    let mut cx = Context::from_waker(&waker);
    std::pin::Pin::new(f).poll(&mut cx)
}
