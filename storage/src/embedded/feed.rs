//! The change feed: replay from the event log, then live batches from the committer.
//!
//! A watcher subscribes to the live broadcast FIRST, then replays the log up to the
//! snapshot it reads. Anything committed before the subscription is in that snapshot;
//! anything committed after it arrives on the broadcast; the overlap is dropped by revision
//! (`seen`). Every revision is in exactly one broadcast batch and batches are consecutive,
//! so a batch that does not start right after `seen` (or a `Lagged` broadcast) means the
//! watcher missed something, and it goes back to replaying the log from `seen`. So the
//! feed is gap-free and duplicate-free no matter how slow the consumer is, and its memory
//! is bounded by the broadcast capacity and the replay chunk.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::time::Instant;

use super::EngineState;
use super::committer::Batch;
use super::tables::Snapshot;
use crate::{FeedItem, FeedStream, KeyRange, Later, Revision, StoreError};

pub(crate) struct Watcher {
    shared: Weak<EngineState>,
    /// None when the store was already closed at subscription time.
    live: Option<broadcast::Receiver<Batch>>,
    range: KeyRange,
    /// Every revision <= `seen` has been delivered (if it matched) or skipped.
    seen: Revision,
    replaying: bool,
    progress_interval: Duration,
    replay_chunk: u64,
    /// When to send a progress notification if nothing was delivered before.
    progress_due: Instant,
    done: bool,
}

/// What the next step of a watcher produced.
enum Step {
    Item(Result<FeedItem, StoreError>),
    Continue,
    End,
}

impl Watcher {
    pub(crate) fn start(
        shared: &Arc<EngineState>,
        live: Option<broadcast::Receiver<Batch>>,
        range: KeyRange,
        after: Revision,
    ) -> FeedStream {
        let progress_interval = shared
            .config
            .progress_interval
            .max(Duration::from_millis(1));
        let watcher = Watcher {
            shared: Arc::downgrade(shared),
            live,
            range,
            seen: after,
            replaying: true,
            progress_interval,
            replay_chunk: shared.config.replay_chunk.max(1),
            progress_due: Instant::now().later(progress_interval),
            done: false,
        };
        futures::stream::unfold(watcher, |mut watcher| async move {
            let item = watcher.next_item().await?;
            Some((item, watcher))
        })
        .boxed()
    }

    async fn next_item(&mut self) -> Option<Result<FeedItem, StoreError>> {
        if self.done {
            return None;
        }
        loop {
            let step = if self.replaying {
                self.replay().await
            } else {
                self.follow().await
            };
            match step {
                Step::Item(item) => {
                    if item.is_err() {
                        // An error ends the feed: the consumer must restart from a list.
                        self.done = true;
                    }
                    self.progress_due = Instant::now().later(self.progress_interval);
                    return Some(item);
                }
                Step::Continue => {}
                Step::End => {
                    self.done = true;
                    return None;
                }
            }
        }
    }

    /// Reads the next chunk of the log after `seen`.
    async fn replay(&mut self) -> Step {
        let Some(shared) = self.shared.upgrade() else {
            return Step::End;
        };
        let (after, range, chunk) = (self.seen, self.range.clone(), self.replay_chunk);
        let read = tokio::task::spawn_blocking(move || {
            let snapshot = Snapshot::open(&*shared.db()?)?;
            let (events, last) = snapshot.events_after(after, &range, chunk)?;
            Ok::<_, StoreError>((events, last, snapshot.revision))
        })
        .await;
        let (events, last, head) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(err)) => return Step::Item(Err(err)),
            Err(join) => return Step::Item(Err(StoreError::Unavailable(join.to_string()))),
        };
        self.seen = last;
        if last >= head {
            self.replaying = false;
        }
        if events.is_empty() {
            Step::Continue
        } else {
            Step::Item(Ok(FeedItem::Events(events)))
        }
    }

    /// Waits for the next live batch, or sends progress when idle.
    async fn follow(&mut self) -> Step {
        let Some(live) = self.live.as_mut() else {
            return Step::End;
        };
        match tokio::time::timeout_at(self.progress_due, live.recv()).await {
            Ok(Ok(batch)) => self.accept(&batch),
            Ok(Err(RecvError::Lagged(_))) => self.fall_back(),
            Ok(Err(RecvError::Closed)) => Step::End,
            Err(_idle) => {
                // Read the published revision, then check the queue: the committer sends a
                // batch before publishing its revision, so an empty queue now proves that
                // every revision up to it has reached this watcher.
                let published = self
                    .shared
                    .upgrade()
                    .map(|s| s.published.revision.load(Ordering::Acquire));
                let Some(published) = published else {
                    return Step::End;
                };
                match live.try_recv() {
                    Ok(batch) => self.accept(&batch),
                    Err(TryRecvError::Lagged(_)) => self.fall_back(),
                    Err(TryRecvError::Closed) => Step::End,
                    // Cannot happen unless a batch went missing; replaying finds it.
                    Err(TryRecvError::Empty) if published > self.seen => self.fall_back(),
                    Err(TryRecvError::Empty) => Step::Item(Ok(FeedItem::Progress(self.seen))),
                }
            }
        }
    }

    fn fall_back(&mut self) -> Step {
        self.replaying = true;
        Step::Continue
    }

    fn accept(&mut self, batch: &Batch) -> Step {
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return Step::Continue;
        };
        if last.revision() <= self.seen {
            return Step::Continue;
        }
        if first.revision() > self.seen.saturating_add(1) {
            // Something between `seen` and this batch never reached us: replay it.
            return self.fall_back();
        }
        let events: Vec<_> = batch
            .iter()
            .filter(|e| e.revision() > self.seen && self.range.contains(&e.kv.key))
            .cloned()
            .collect();
        self.seen = last.revision();
        if events.is_empty() {
            // Nothing in range, but the watcher is now current up to this batch: say so at
            // once, so a cache waiting for a revision written elsewhere need not wait for
            // the idle timer.
            Step::Item(Ok(FeedItem::Progress(self.seen)))
        } else {
            Step::Item(Ok(FeedItem::Events(events)))
        }
    }
}
