//! The change feed on etcd: one watch stream per feed, resumed after transport errors.
//!
//! - The watch starts at revision `after` (not `after + 1`) and drops events at or below
//!   `after`: etcd refuses a start below its compaction point, so starting at `after` makes
//!   etcd refuse exactly when `after` is below the compacted revision, as the contract says.
//! - When the stream delivered nothing for `progress_interval`, the feed asks for a progress
//!   notification (`RequestProgress`); etcd answers once the watcher is caught up, with the
//!   store's revision. One watcher per stream, so the answer is about this watcher only.
//!   etcd's own periodic notifications (`progress_notify`) are asked for too.
//! - A failed stream (member killed, etcd restarting) is reopened from the last revision
//!   delivered, on the next endpoint, with back-off; events already delivered are dropped, so the consumer sees
//!   neither gaps nor duplicates and the feed stays open while etcd is away. Only a
//!   compaction past that revision ends it (`Compacted`, then the end).
//! - Events go through a bounded channel: a slow consumer slows the etcd stream (gRPC flow
//!   control) instead of growing a buffer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::client::WatchStream;
use super::pb::etcdserverpb::{WatchCreateRequest, WatchResponse};
use super::pb::mvccpb::event::EventType;
use super::{EtcdState, map_error};
use crate::{
    Event, EventKind, FeedItem, FeedStream, KeyRange, KeyValue, Later, Revision, StoreError,
};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

pub(super) fn start(
    shared: Arc<EtcdState>,
    range: KeyRange,
    after: Revision,
    closed: watch::Receiver<bool>,
) -> FeedStream {
    let (tx, rx) = mpsc::channel(shared.config.feed_buffer.max(1));
    tokio::spawn(run(shared, range, after, closed, tx));
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

/// Why one watch stream stopped.
enum Stop {
    /// The consumer or the store went away: the feed is over.
    Done,
    /// The stream failed; reopen from the last delivered revision.
    Retry(StoreError),
}

struct Feed {
    shared: Arc<EtcdState>,
    tx: mpsc::Sender<Result<FeedItem, StoreError>>,
    /// Highest event revision delivered (events at or below it are duplicates).
    last_event: Revision,
    /// Highest revision delivered, events or progress: where a reopened watch resumes.
    last: Revision,
    /// Whether the current stream delivered anything (resets the back-off).
    heard: bool,
    /// The endpoint the current stream is on (to fail over from).
    endpoint: usize,
}

async fn run(
    shared: Arc<EtcdState>,
    range: KeyRange,
    after: Revision,
    mut closed: watch::Receiver<bool>,
    tx: mpsc::Sender<Result<FeedItem, StoreError>>,
) {
    let (key, end) = shared.full_range(&range);
    let mut feed = Feed {
        shared,
        tx,
        last_event: after,
        last: after,
        heard: false,
        endpoint: 0,
    };
    let mut backoff = BACKOFF_MIN;
    // A second handle only to notice the consumer leaving while `feed` is borrowed.
    let consumer = feed.tx.clone();
    loop {
        let stop = tokio::select! {
            stop = feed.follow(&key, &end) => stop,
            _ = closed.changed() => Stop::Done,
            _ = consumer.closed() => Stop::Done,
        };
        match stop {
            Stop::Done => return,
            Stop::Retry(err) => {
                tracing::debug!(error = %err, resume_after = feed.last, "etcd feed: reopening the watch");
                if std::mem::take(&mut feed.heard) {
                    // The stream worked for a while: this is a new outage, retry quickly.
                    backoff = BACKOFF_MIN;
                }
                feed.shared.fail_over(feed.endpoint);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = closed.changed() => return,
                    _ = feed.tx.closed() => return,
                }
                backoff = backoff.saturating_mul(2).min(BACKOFF_MAX);
            }
        }
    }
}

impl Feed {
    async fn send(&self, item: Result<FeedItem, StoreError>) -> Result<(), Stop> {
        self.tx.send(item).await.map_err(|_| Stop::Done)
    }

    /// Opens one watch stream and forwards it until it fails or the feed ends.
    async fn follow(&mut self, key: &[u8], end: &[u8]) -> Stop {
        match self.follow_inner(key, end).await {
            Ok(never) => match never {},
            Err(stop) => stop,
        }
    }

    async fn follow_inner(
        &mut self,
        key: &[u8],
        end: &[u8],
    ) -> Result<std::convert::Infallible, Stop> {
        // etcd reads start revision 0 as "now"; 1 is the oldest there is.
        let start = self.last.max(1);
        let create = WatchCreateRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            start_revision: start,
            progress_notify: true,
            prev_kv: true,
            ..WatchCreateRequest::default()
        };
        let (endpoint, client) = self.shared.client();
        self.endpoint = endpoint;
        let open =
            tokio::time::timeout(self.shared.config.request_timeout, client.watch(create)).await;
        let mut stream: WatchStream = match open {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(Stop::Retry(map_error(e))),
            Err(_) => {
                return Err(Stop::Retry(StoreError::Unavailable(
                    "opening an etcd watch timed out".to_string(),
                )));
            }
        };
        let interval = self.shared.config.progress_interval;
        let mut idle_deadline = Instant::now().later(interval);
        // A stream that is silent well past our progress requests is presumed dead.
        let dead_after = self
            .shared
            .config
            .request_timeout
            .max(interval.saturating_mul(4));
        let mut last_heard = Instant::now();
        loop {
            tokio::select! {
                message = stream.message() => {
                    let resp = match message {
                        Ok(Some(resp)) => resp,
                        Ok(None) => {
                            return Err(Stop::Retry(StoreError::Unavailable(
                                "etcd closed the watch stream".to_string(),
                            )));
                        }
                        Err(e) => return Err(Stop::Retry(map_error(e))),
                    };
                    last_heard = Instant::now();
                    self.heard = true;
                    idle_deadline = last_heard.later(interval);
                    self.handle(resp).await?;
                }
                _ = tokio::time::sleep_until(idle_deadline) => {
                    if last_heard.elapsed() > dead_after {
                        return Err(Stop::Retry(StoreError::Unavailable(
                            "etcd watch stream went silent".to_string(),
                        )));
                    }
                    if let Err(e) = stream.request_progress() {
                        return Err(Stop::Retry(map_error(e)));
                    }
                    idle_deadline = Instant::now().later(interval);
                }
            }
        }
    }

    async fn handle(&mut self, resp: WatchResponse) -> Result<(), Stop> {
        if resp.canceled {
            let compacted = resp.compact_revision;
            if compacted > 0 {
                self.shared.note_compacted(compacted);
                let err = StoreError::Compacted {
                    requested: self.last,
                    compacted,
                };
                // The contract: after an error item the feed ends.
                let _ = self.send(Err(err)).await;
                return Err(Stop::Done);
            }
            return Err(Stop::Retry(StoreError::Unavailable(format!(
                "etcd canceled the watch: {}",
                resp.cancel_reason
            ))));
        }
        if resp.created {
            // Only confirms the watch; the watcher may still be catching up, so its header
            // revision is not a progress statement.
            return Ok(());
        }
        if resp.events.is_empty() {
            // A progress notification: every event up to the header revision was sent.
            let revision = resp.header.map_or(0, |h| h.revision);
            if revision >= self.last && revision > 0 {
                self.last = revision;
                self.send(Ok(FeedItem::Progress(revision))).await?;
            }
            return Ok(());
        }
        let mut events = Vec::with_capacity(resp.events.len());
        for event in resp.events {
            let kind = match EventType::try_from(event.r#type) {
                Ok(EventType::Put) => EventKind::Put,
                Ok(EventType::Delete) => EventKind::Delete,
                Err(_) => {
                    // Not etcd's v3 API as we know it: reopening would only meet it again.
                    let detail = format!("etcd sent an event of unknown type {}", event.r#type);
                    let _ = self.send(Err(StoreError::Backend(detail.into()))).await;
                    return Err(Stop::Done);
                }
            };
            let Some(kv) = event.kv else { continue };
            if kv.mod_revision <= self.last_event {
                // Already delivered before the stream was reopened.
                continue;
            }
            let kv = match kind {
                EventKind::Put => self.shared.convert(kv),
                EventKind::Delete => KeyValue {
                    value: bytes::Bytes::new(),
                    create_revision: 0,
                    version: 0,
                    ..self.shared.convert(kv)
                },
            };
            events.push(Event {
                kind,
                kv,
                prev_kv: event.prev_kv.map(|p| self.shared.convert(p)),
            });
        }
        if let Some(last) = events.last() {
            self.last_event = last.revision();
            self.last = self.last.max(self.last_event);
            self.send(Ok(FeedItem::Events(events))).await?;
        }
        Ok(())
    }
}
