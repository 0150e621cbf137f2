//! One fill loop for every watch cache, whatever feeds it: the store's change feed in
//! standalone mode ([`super::StoreSource`]), the upstream's list+watch in proxy mode
//! (`upstream/source.rs`). A [`Source`] lists everything and follows the changes after a
//! revision; [`run`] lists, follows, prunes on a timer while the feed is quiet, resumes from
//! the last revision reached when a feed ends or fails, and lists again when the source says
//! its history no longer reaches back (a gap).
//!
//! **A relist resyncs; it does not replace** (both modes). After a gap the new list's
//! differences from the cached state reach every watcher as ordinary events
//! (`WatchCache::resync`), and each watcher that takes bookmarks is told the new revision at
//! once, so watchers stay connected and resume from the cache without a relist of their own.
//! kube-apiserver's cacher instead ends all its watchers when its reflector lists again, and
//! each client whose version the new cache no longer serves lists everything: measured on the
//! simulated cluster (BENCHMARKS.md "A simulated cluster"), 6,363 relists of 5,250 agent
//! informers after a kube-apiserver restart directly, none through the proxy. The one
//! exception is a state no feed has carried on from since it was listed at a past revision
//! (a proxy's resume point, [`Listed::resumed`]): its watchers may stand anywhere after that
//! revision, where a resync's differences are not theirs, so it is replaced and they end
//! with 410.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng as _;
use svc_core::watch::{ApplyReport, WatchCache};
use svc_storage::{FeedItem, KeyValue, Revision};
use tokio::sync::{Notify, watch};

/// How often a cache's history and snapshots are pruned while its feed is quiet (a quiet
/// resource sends nothing that would age them out).
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// A full read of a source.
pub struct Listed {
    pub kvs: Vec<KeyValue>,
    pub revision: Revision,
    /// Read at a revision kept from an earlier run, not the newest (see the module docs).
    pub resumed: bool,
}

/// Why a feed ended.
#[derive(Debug)]
pub enum Gap {
    /// The source's history no longer reaches back to where the feed was to start or go on
    /// (a compacted store, an upstream 410): list again.
    Expired,
    /// The feed ended in the ordinary way (a watch's timeout, an idle watch given up on):
    /// follow again from the last revision reached.
    Closed,
    /// The feed failed: follow again from the last revision reached, after a back-off.
    Failed(String),
    /// The source is gone for good (the store closed): the loop ends.
    Shut,
}

/// The changes of a source after a revision.
pub trait Feed: Send {
    /// The next item: committed events in revision order, or progress (nothing changed up to
    /// a revision). Cancel-safe: a call dropped before it completes loses nothing.
    fn next(&mut self) -> impl Future<Output = Result<FeedItem, Gap>> + Send;
}

/// What a watch cache is filled from.
pub trait Source: Send + 'static {
    type Feed: Feed;
    /// The back-off between failed lists or feeds: from the first, doubling up to the second.
    const BACKOFF: (Duration, Duration);
    /// Everything, and the revision of the read.
    fn list(&mut self) -> impl Future<Output = Result<Listed, String>> + Send;
    /// The changes after `from`.
    fn follow(&mut self, from: Revision) -> impl Future<Output = Result<Self::Feed, Gap>> + Send;
}

/// What a fill loop reports, read by metrics, `/readyz` and the read path.
#[derive(Debug, Default)]
pub struct FillStatus {
    /// The cache has been filled at least once.
    pub synced: AtomicBool,
    /// A feed is open now.
    pub watching: AtomicBool,
    /// Full lists read (the first one included).
    pub lists: AtomicU64,
    /// The revision of the last full list the cache was filled or resynced with: the source
    /// serves no feed from before it (that is why it was read), and every watcher of the
    /// cache was told it at once (a resync bookmarks them all).
    pub filled_at: AtomicI64,
    /// Feeds opened.
    pub watches: AtomicU64,
    /// A feed of this cache has carried progress (a bookmark): the source sends it, so
    /// silence on a feed is a sign of trouble.
    pub bookmarks: AtomicBool,
    /// Milliseconds since the loop started at the last word from the source (events,
    /// progress, a list), for the lag metric.
    pub last_contact_ms: AtomicI64,
    pub started: std::sync::OnceLock<Instant>,
}

impl FillStatus {
    fn contact(&self) {
        let start = *self.started.get_or_init(Instant::now);
        let ms = i64::try_from(start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.last_contact_ms.store(ms, Ordering::Relaxed);
    }

    /// Seconds since the source last said something about this cache.
    pub fn silence(&self) -> f64 {
        let start = *self.started.get_or_init(Instant::now);
        let now = start.elapsed().as_millis() as f64;
        ((now - self.last_contact_ms.load(Ordering::Relaxed) as f64) / 1000.0).max(0.0)
    }
}

/// How a feed ended, with the last revision it reached.
enum End {
    Stopped,
    Expired,
    Closed(Revision),
    Failed(Revision, String),
}

/// Fills `cache` from `source` until `stop` is set (or the source shuts): list, follow,
/// resume, list again after a gap. `changed` is woken after each fill and each batch of
/// events (the CRD cache's, for rediscovery).
pub async fn run<S: Source>(
    mut source: S,
    cache: WatchCache,
    status: Arc<FillStatus>,
    changed: Option<Arc<Notify>>,
    mut stop: watch::Receiver<bool>,
) {
    let info = cache.codec().info;
    status.started.get_or_init(Instant::now);
    let (min, max) = S::BACKOFF;
    let mut backoff = min;
    let mut from: Option<Revision> = None;
    // The cache holds a resumed state that no feed has carried on from yet, and whether the
    // next fill replaces the cache instead of resyncing it (the module docs).
    let mut resumed = false;
    let mut replace = false;
    loop {
        if *stop.borrow() {
            return;
        }
        let rev = match from {
            Some(rev) => rev,
            None => {
                let listed = tokio::select! {
                    l = source.list() => l,
                    _ = crate::base::lifecycle::until_set(&mut stop) => return,
                };
                match listed {
                    Ok(l) => {
                        resumed = l.resumed;
                        let now = Instant::now();
                        // An empty cache (the first fill) is filled whole either way.
                        let report = if std::mem::take(&mut replace) {
                            cache.replace(&l.kvs, l.revision, now)
                        } else {
                            cache.resync(&l.kvs, l.revision, now)
                        };
                        left_out(&cache, &report);
                        status.lists.fetch_add(1, Ordering::Relaxed);
                        status.filled_at.store(l.revision, Ordering::Release);
                        status.synced.store(true, Ordering::Release);
                        status.contact();
                        if let Some(n) = &changed {
                            n.notify_one();
                        }
                        l.revision
                    }
                    Err(e) => {
                        tracing::warn!(resource = info.plural, group = info.group, error = %e, "listing failed");
                        if sleep_or_stop(&mut stop, jitter(backoff)).await {
                            return;
                        }
                        backoff = backoff.saturating_mul(2).min(max);
                        continue;
                    }
                }
            }
        };
        status.watching.store(true, Ordering::Relaxed);
        status.watches.fetch_add(1, Ordering::Relaxed);
        let end = follow(&mut source, &cache, &status, &changed, rev, &mut stop).await;
        status.watching.store(false, Ordering::Relaxed);
        match end {
            End::Stopped => return,
            // A resumed state the source's history no longer reaches is replaced, not
            // resynced (the module docs).
            End::Expired => {
                replace = std::mem::take(&mut resumed);
                let why = if replace {
                    "the resumed revision is no longer held: filling from the newest state"
                } else {
                    "history compacted: relisting"
                };
                tracing::info!(resource = info.plural, group = info.group, "{why}");
                from = None;
                backoff = min;
            }
            End::Closed(last) => {
                resumed = false;
                from = Some(last);
                backoff = min;
            }
            End::Failed(last, e) => {
                resumed &= last <= rev;
                tracing::warn!(resource = info.plural, group = info.group, error = %e, "feed failed");
                from = Some(last);
                if sleep_or_stop(&mut stop, jitter(backoff)).await {
                    return;
                }
                backoff = backoff.saturating_mul(2).min(max);
            }
        }
    }
}

/// Follows `source` from `from`, applying what comes to the cache, until the feed ends.
async fn follow<S: Source>(
    source: &mut S,
    cache: &WatchCache,
    status: &FillStatus,
    changed: &Option<Arc<Notify>>,
    from: Revision,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let mut last = from;
    let opened = tokio::select! {
        f = source.follow(from) => f,
        _ = crate::base::lifecycle::until_set(stop) => return End::Stopped,
    };
    let mut feed = match opened {
        Ok(f) => f,
        Err(gap) => return ended(gap, last),
    };
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let item = tokio::select! {
            i = feed.next() => i,
            _ = prune.tick() => {
                cache.prune(Instant::now());
                continue;
            }
            _ = crate::base::lifecycle::until_set(stop) => return End::Stopped,
        };
        let item = match item {
            Ok(i) => i,
            Err(gap) => return ended(gap, last),
        };
        status.contact();
        let events = match &item {
            FeedItem::Events(events) => {
                if let Some(top) = events.iter().map(|e| e.kv.mod_revision).max() {
                    last = last.max(top);
                }
                true
            }
            FeedItem::Progress(rev) => {
                status.bookmarks.store(true, Ordering::Relaxed);
                last = last.max(*rev);
                false
            }
        };
        apply(cache, item);
        if events && let Some(n) = changed {
            n.notify_one();
        }
    }
}

/// Applies a feed item to `cache` now, logging the objects it could not take: the fill loop's
/// and a proof of freshness's (`upstream/fresh.rs`) way of bringing a cache forward.
pub fn apply(cache: &WatchCache, item: FeedItem) {
    let report = cache.apply(item, Instant::now());
    left_out(cache, &report);
}

/// Logs the first objects a fill or an item left out of `cache`, with their count.
fn left_out(cache: &WatchCache, report: &ApplyReport) {
    let info = cache.codec().info;
    for e in report.errors.iter().take(3) {
        tracing::warn!(resource = info.plural, group = info.group, errors = report.error_count, error = %e, "objects left out of the cache");
    }
}

fn ended(gap: Gap, last: Revision) -> End {
    match gap {
        Gap::Expired => End::Expired,
        Gap::Closed => End::Closed(last),
        Gap::Failed(e) => End::Failed(last, e),
        Gap::Shut => End::Stopped,
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.5..1.0))
}

/// Sleeps `d`; true when `stop` was set meanwhile.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        _ = crate::base::lifecycle::until_set(stop) => true,
    }
}

#[cfg(test)]
mod sources;
#[cfg(test)]
mod tests;
