//! The fill loop against a scripted source: what it does on each way a feed ends, and the
//! relist policy (resync, or replace for a resumed state) as a watcher sees it.
// Test code: a panic on a broken expectation is the point.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use svc_core::watch::{FrameFormat, Selector, WatchCacheConfig, WatchRequest, WatchStart, Watcher};
use svc_storage::{Event, EventKind, FeedItem, KeyValue, Revision};
use tokio::sync::{Notify, watch};

use super::*;
use crate::outbound::upstream::discovery::core_kind;
use crate::outbound::upstream::watch::key_value;

/// One step of a scripted feed.
enum Step {
    Item(FeedItem),
    /// Waits until the test says go.
    Hold(Arc<Notify>),
    End(Gap),
}

/// A source that answers lists and feeds from scripts, and records where each feed began.
#[derive(Clone, Default)]
struct Scripted {
    lists: Arc<Mutex<VecDeque<Result<Listed, String>>>>,
    feeds: Arc<Mutex<VecDeque<Vec<Step>>>>,
    follows: Arc<Mutex<Vec<Revision>>>,
}

struct ScriptedFeed(VecDeque<Step>);

impl Feed for ScriptedFeed {
    async fn next(&mut self) -> Result<FeedItem, Gap> {
        loop {
            match self.0.front() {
                None => std::future::pending::<()>().await,
                Some(Step::Hold(go)) => {
                    go.clone().notified().await;
                    self.0.pop_front();
                }
                Some(_) => match self.0.pop_front() {
                    Some(Step::Item(i)) => return Ok(i),
                    Some(Step::End(g)) => return Err(g),
                    _ => {}
                },
            }
        }
    }
}

impl Source for Scripted {
    type Feed = ScriptedFeed;
    const BACKOFF: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(2));

    async fn list(&mut self) -> Result<Listed, String> {
        let next = self.lists.lock().pop_front();
        match next {
            Some(l) => l,
            None => std::future::pending().await,
        }
    }

    async fn follow(&mut self, from: Revision) -> Result<ScriptedFeed, Gap> {
        self.follows.lock().push(from);
        let steps = self.feeds.lock().pop_front();
        Ok(ScriptedFeed(steps.unwrap_or_default().into()))
    }
}

fn pods() -> &'static ResourceInfo {
    core_kind("pods", "Pod", true)
}

fn pod(name: &str, rev: Revision) -> KeyValue {
    key_value(
        pods(),
        Bytes::from(format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rev}"}}}}"#
        )),
    )
    .unwrap()
}

fn put(name: &str, rev: Revision) -> FeedItem {
    FeedItem::Events(vec![Event {
        kind: EventKind::Put,
        kv: pod(name, rev),
        prev_kv: None,
    }])
}

fn listed(kvs: Vec<KeyValue>, revision: Revision, resumed: bool) -> Result<Listed, String> {
    Ok(Listed {
        kvs,
        revision,
        resumed,
    })
}

use svc_core::ResourceInfo;

struct Running {
    cache: WatchCache,
    status: Arc<FillStatus>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(source: Scripted) -> Running {
    let cache = WatchCache::new(
        svc_core::watch::unstructured::codec(pods()),
        WatchCacheConfig::default(),
    );
    let status = Arc::new(FillStatus::default());
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(run(source, cache.clone(), status.clone(), None, rx));
    Running {
        cache,
        status,
        stop,
        task,
    }
}

pub(super) async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(super) fn watcher(cache: &WatchCache, after: Revision) -> Watcher {
    cache
        .watch(
            WatchRequest {
                namespace: None,
                selector: Selector::default(),
                start: WatchStart::After(after),
                bookmarks: false,
                format: FrameFormat::Json,
            },
            Instant::now(),
        )
        .unwrap()
}

/// The `TYPE name@rv` of each JSON frame drained, and whether the watcher is over.
pub(super) fn drained(w: &mut Watcher) -> (Vec<String>, bool) {
    let d = w.drain(1 << 20, Instant::now());
    let got = d
        .frames
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            let m = &v["object"]["metadata"];
            format!(
                "{} {}@{}",
                v["type"].as_str().unwrap_or_default(),
                m["name"].as_str().unwrap_or_default(),
                m["resourceVersion"].as_str().unwrap_or_default()
            )
        })
        .collect();
    (got, d.finished || w.is_finished())
}

#[tokio::test]
async fn a_gap_resyncs_the_cache_and_its_watchers_stay() {
    let source = Scripted::default();
    let go = Arc::new(Notify::new());
    source
        .lists
        .lock()
        .extend([listed(vec![pod("a", 5), pod("b", 6)], 10, false)]);
    source.feeds.lock().extend([vec![
        Step::Item(put("c", 11)),
        Step::Hold(go.clone()),
        Step::End(Gap::Expired),
    ]]);
    let r = start(source.clone());
    until("the first event applied", || r.cache.revision() == 11).await;
    let mut w = watcher(&r.cache, 11);
    // The source's history is gone: a new list at 20, where b is gone and c changed.
    source
        .lists
        .lock()
        .push_back(listed(vec![pod("a", 5), pod("c", 15)], 20, false));
    go.notify_one();
    until("the relist applied", || r.cache.revision() == 20).await;
    let (got, over) = drained(&mut w);
    assert_eq!(got, ["MODIFIED c@15", "DELETED b@20"]);
    assert!(!over, "the watcher goes on after a relist");
    assert_eq!(r.status.lists.load(Ordering::Relaxed), 2);
    assert_eq!(r.status.filled_at.load(Ordering::Relaxed), 20);
    // And the next feed starts from the new list's revision.
    until("following from the relist", || {
        source.follows.lock().as_slice() == [10, 20]
    })
    .await;
    let _ = r.stop.send(true);
    r.task.await.unwrap();
}

#[tokio::test]
async fn a_resumed_state_no_feed_carried_on_is_replaced_and_its_watchers_end() {
    let source = Scripted::default();
    let go = Arc::new(Notify::new());
    source
        .lists
        .lock()
        .extend([listed(vec![pod("a", 5)], 8, true)]);
    // The feed from the resume point fails at once: the upstream no longer holds it.
    source
        .feeds
        .lock()
        .extend([vec![Step::Hold(go.clone()), Step::End(Gap::Expired)]]);
    let r = start(source.clone());
    until("the resumed fill", || {
        r.status.synced.load(Ordering::Acquire)
    })
    .await;
    let mut w = watcher(&r.cache, 8);
    source
        .lists
        .lock()
        .push_back(listed(vec![pod("a", 5), pod("d", 30)], 40, false));
    go.notify_one();
    until("the new fill", || r.cache.revision() == 40).await;
    let (_, over) = drained(&mut w);
    assert!(over, "a replaced cache ends its watchers (with 410)");
    let _ = r.stop.send(true);
    r.task.await.unwrap();
}

#[tokio::test]
async fn a_resumed_state_a_feed_carried_on_from_is_resynced() {
    let source = Scripted::default();
    let go = Arc::new(Notify::new());
    source
        .lists
        .lock()
        .extend([listed(vec![pod("a", 5)], 8, true)]);
    // The feed carried the resumed state on (an event past it), then failed, and the next
    // one found the history gone.
    source.feeds.lock().extend([
        vec![
            Step::Item(put("b", 9)),
            Step::End(Gap::Failed("cut".into())),
        ],
        vec![Step::Hold(go.clone()), Step::End(Gap::Expired)],
    ]);
    let r = start(source.clone());
    until("the second feed", || source.follows.lock().len() == 2).await;
    assert_eq!(
        source.follows.lock().as_slice(),
        [8, 9],
        "resumed from the last event"
    );
    let mut w = watcher(&r.cache, 9);
    source.lists.lock().push_back(listed(
        vec![pod("a", 5), pod("b", 9), pod("e", 12)],
        14,
        false,
    ));
    go.notify_one();
    until("the relist", || r.cache.revision() == 14).await;
    let (got, over) = drained(&mut w);
    assert_eq!(got, ["ADDED e@12"]);
    assert!(!over);
    let _ = r.stop.send(true);
    r.task.await.unwrap();
}

#[tokio::test]
async fn a_closed_feed_is_followed_again_from_its_last_revision_without_a_list() {
    let source = Scripted::default();
    source.lists.lock().extend([listed(vec![], 3, false)]);
    source.feeds.lock().extend([
        vec![Step::Item(put("a", 4)), Step::End(Gap::Closed)],
        vec![Step::Item(FeedItem::Progress(7)), Step::End(Gap::Closed)],
        vec![],
    ]);
    let r = start(source.clone());
    until("three feeds", || source.follows.lock().len() == 3).await;
    assert_eq!(source.follows.lock().as_slice(), [3, 4, 7]);
    assert_eq!(r.status.lists.load(Ordering::Relaxed), 1);
    assert!(r.status.bookmarks.load(Ordering::Relaxed), "progress seen");
    assert_eq!(r.cache.revision(), 7);
    let _ = r.stop.send(true);
    r.task.await.unwrap();
}

#[tokio::test]
async fn a_failed_list_is_retried_and_a_shut_source_ends_the_loop() {
    let source = Scripted::default();
    source.lists.lock().extend([
        Err("refused".to_string()),
        listed(vec![pod("a", 2)], 2, false),
    ]);
    source.feeds.lock().extend([vec![Step::End(Gap::Shut)]]);
    let r = start(source.clone());
    tokio::time::timeout(Duration::from_secs(5), r.task)
        .await
        .expect("the loop ends when its source shuts")
        .unwrap();
    assert!(r.status.synced.load(Ordering::Acquire));
    assert_eq!(r.status.lists.load(Ordering::Relaxed), 1);
    assert_eq!(r.cache.revision(), 2);
}

/// History ages out on the timer while the feed says nothing.
#[tokio::test]
async fn a_quiet_feed_still_prunes() {
    let source = Scripted::default();
    source.lists.lock().extend([listed(vec![], 1, false)]);
    source.feeds.lock().extend([vec![Step::Item(put("a", 2))]]);
    let cache = WatchCache::new(
        svc_core::watch::unstructured::codec(pods()),
        WatchCacheConfig {
            history_window: Duration::from_millis(50),
            ..WatchCacheConfig::default()
        },
    );
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(run(
        source,
        cache.clone(),
        Arc::new(FillStatus::default()),
        None,
        rx,
    ));
    until("the event applied", || cache.revision() == 2).await;
    until("the event aged out of the history", || {
        cache.oldest_revision() >= 2
    })
    .await;
    let _ = stop.send(true);
    task.await.unwrap();
}
