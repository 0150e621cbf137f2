//! The upstream as a cache's source (`reflector.rs`): a streaming list (a watch with
//! `sendInitialEvents`, ended by its `initial-events-end` bookmark) where the upstream offers
//! one, else a paginated list (the first page a consistent read), then a watch with bookmarks
//! from the list's resourceVersion, read line by line into feed items
//! (`outbound/upstream/watch.rs` speaks the protocol).
//!
//! Quiet resources: kube-apiserver bookmarks the watches of the resources it watch-caches
//! about once a minute, and sends no bookmarks at all for those it does not (Events), whose
//! watches read etcd directly. A watch of such a resource resumed from its last event after a
//! quiet spell longer than etcd's compaction interval (5 minutes in kube-apiserver) is a 410
//! and a full relist, for nothing having happened. So watches are asked to last hours
//! ([`WATCH_SECONDS`], where client-go asks 5 to 10 minutes), and silence counts against a
//! watch only once its resource has been seen to bookmark: past
//! `--upstream-watch-idle-timeout` (150 s) such a watch may be hung, and is opened again from
//! where it was, at once and quietly. A dead connection under a quiet watch is found by the
//! upstream client's h2 PINGs (`outbound/client.rs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use rand::Rng as _;
use svc_core::ResourceInfo;
use svc_storage::{Event, FeedItem, Revision};

use crate::outbound::upstream::Upstream;
use crate::outbound::upstream::watch::{
    self as protocol, LineEnd, MAX_LINE, STREAMING_LIST_TIMEOUT, Taken, WatchBody,
};
use crate::registry::caches::reflector::{Feed, FillStatus, Gap, Listed, Source};

/// How long an upstream watch is asked to last (`timeoutSeconds`), chosen at random in this
/// range for each watch: 2 to 4 hours. A quiet resource's watch resumed after etcd compacted
/// past its last event is a full relist; a long watch makes that rare. kube-apiserver puts no
/// limit on it (its own default is 30 to 60 minutes).
pub const WATCH_SECONDS: std::ops::Range<u64> = 7_200..14_400;

/// One resource upstream.
pub struct UpstreamSource {
    pub upstream: Upstream,
    pub info: &'static ResourceInfo,
    /// The fill loop's status: whether the resource has been seen to bookmark.
    pub status: Arc<FillStatus>,
    /// `--upstream-watch-idle-timeout`.
    pub idle: Duration,
    /// The revision a previous run of this proxy kept (`resume.rs`): the first list is the
    /// upstream's state there (an Exact list), and the watch goes on from it, so that clients
    /// of the previous run resume their watches from this cache; the newest state, as without
    /// it, when the upstream no longer holds that revision.
    pub resume_from: Option<Revision>,
    /// Cleared once a streaming list fails: this resource is listed in pages from then on
    /// (an upstream that ignores `sendInitialEvents` never ends the initial events).
    pub streaming: bool,
}

impl Source for UpstreamSource {
    type Feed = UpstreamFeed;
    const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));

    async fn list(&mut self) -> Result<Listed, String> {
        let (upstream, info) = (&self.upstream, self.info);
        if let Some(at) = self.resume_from.take() {
            let read = match protocol::list(upstream, info, Some(at)).await {
                // Listed: the upstream must also still watch from there, or the cache would
                // take watchers it cannot carry on for (checked before any join).
                Ok(read) if protocol::watchable_from(upstream, info, at).await => Ok(read),
                Ok(_) => Err("the upstream no longer watches from it".to_string()),
                Err(e) => Err(e),
            };
            match read {
                Ok((kvs, revision)) => {
                    tracing::info!(
                        resource = info.plural,
                        group = info.group,
                        revision = at,
                        "resuming from the revision kept by the last run"
                    );
                    return Ok(Listed {
                        kvs,
                        revision,
                        resumed: true,
                    });
                }
                Err(e) => tracing::info!(
                    resource = info.plural,
                    group = info.group,
                    revision = at,
                    error = %e,
                    "cannot resume from the revision kept by the last run: listing the newest state"
                ),
            }
        }
        if self.streaming {
            let outcome = match tokio::time::timeout(
                STREAMING_LIST_TIMEOUT,
                protocol::streaming_list(upstream, info),
            )
            .await
            {
                Ok(Ok(Some((kvs, revision)))) => {
                    return Ok(Listed {
                        kvs,
                        revision,
                        resumed: false,
                    });
                }
                // Not offered (an upstream without WatchList refuses the request).
                Ok(Ok(None)) => "refused".to_string(),
                Ok(Err(e)) => e,
                Err(_) => format!("no end within {STREAMING_LIST_TIMEOUT:?}"),
            };
            tracing::info!(resource = info.plural, group = info.group, why = %outcome, "listing in pages: the upstream's streaming list did not serve");
            self.streaming = false;
        }
        let (kvs, revision) = protocol::list(upstream, info, None).await?;
        Ok(Listed {
            kvs,
            revision,
            resumed: false,
        })
    }

    async fn follow(&mut self, from: Revision) -> Result<UpstreamFeed, Gap> {
        let timeout = rand::rng().random_range(WATCH_SECONDS);
        let body = protocol::watch(&self.upstream, self.info, from, timeout)
            .await
            .map_err(gap)?;
        Ok(UpstreamFeed {
            body,
            info: self.info,
            status: self.status.clone(),
            buf: BytesMut::new(),
            ready: VecDeque::new(),
            heard: tokio::time::Instant::now(),
            timeout: Duration::from_secs(timeout),
            idle: self.idle,
        })
    }
}

fn gap(end: LineEnd) -> Gap {
    match end {
        LineEnd::Expired => Gap::Expired,
        LineEnd::Failed(e) => Gap::Failed(e),
    }
}

/// An upstream watch, read into feed items.
pub struct UpstreamFeed {
    body: WatchBody,
    info: &'static ResourceInfo,
    status: Arc<FillStatus>,
    /// Bytes read past the last whole line.
    buf: BytesMut,
    /// Items read and not yet taken, the feed's end last.
    ready: VecDeque<Result<FeedItem, Gap>>,
    /// When the upstream last sent something.
    heard: tokio::time::Instant,
    /// The watch's own `timeoutSeconds`.
    timeout: Duration,
    idle: Duration,
}

impl UpstreamFeed {
    /// Reads the whole lines in `buf` into `ready`: events up to each bookmark as one item,
    /// then the bookmark as progress; an error line ends the feed.
    fn take_lines(&mut self) {
        let mut events = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(nl.saturating_add(1)).freeze();
            let next = match protocol::take_line(self.info, &line, &mut events) {
                Ok(Taken::Event(_) | Taken::Nothing) => continue,
                Ok(Taken::Bookmark(rev)) => Ok(FeedItem::Progress(rev)),
                Err(end) => Err(gap(end)),
            };
            let ends = next.is_err();
            self.push_events(&mut events);
            self.ready.push_back(next);
            if ends {
                return;
            }
        }
        self.push_events(&mut events);
        if self.buf.len() > MAX_LINE {
            self.ready.push_back(Err(Gap::Failed(format!(
                "a watch event over {MAX_LINE} bytes"
            ))));
        }
    }

    /// The events read since the last item, as one item, if any.
    fn push_events(&mut self, events: &mut Vec<Event>) {
        if !events.is_empty() {
            self.ready
                .push_back(Ok(FeedItem::Events(std::mem::take(events))));
        }
    }
}

impl Feed for UpstreamFeed {
    async fn next(&mut self) -> Result<FeedItem, Gap> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return item;
            }
            // Silence is a sign of trouble only where the upstream bookmarks.
            let patience = if self.status.bookmarks.load(Ordering::Relaxed) {
                self.idle
            } else {
                self.timeout.saturating_add(self.idle)
            };
            let deadline = self.heard.checked_add(patience).unwrap_or(self.heard);
            let chunk = tokio::time::timeout_at(deadline, self.body.chunk()).await;
            self.heard = tokio::time::Instant::now();
            let data = match chunk {
                Err(_) | Ok(None) => return Err(Gap::Closed),
                Ok(Some(Err(e))) => return Err(Gap::Failed(e)),
                Ok(Some(Ok(d))) => d,
            };
            self.buf.extend_from_slice(&data);
            self.take_lines();
        }
    }
}
