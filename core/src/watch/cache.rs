//! `WatchCache`: one per resource type (Kubernetes' `watch_cache.go` plus the ingest half of
//! `cacher.go`). It applies the store's change feed to the current state, records each change
//! in the history ring, keeps list snapshots, and dispatches each event to the watchers it
//! concerns. Lists are answered from O(1) snapshots outside any lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use svc_storage::{Event, EventKind, FeedItem, KeyValue, Revision};

use super::cached::{CachedObject, KindCodec};
use super::dispatch::{QUEUE_START, Registry, SlotState, WatcherSlot};
use super::frames::{FrameEncoder, FrameFormat};
use super::history::{EventType, HistoryRing, WatchCacheEvent};
use super::interval::WatchCacheInterval;
use super::settings::WatchCacheConfig;
use super::snapshots::{SnapshotRing, State};
use super::waiters::{RevisionWait, Waiters};
use super::wakes::{WakeGate, Wakeup};
use super::watcher::{WatchFilter, WatchRequest, WatchStart, Watcher};
use crate::status::ApiError;

/// An event just dispatched, with the frames its watchers will need (`frame_bit`s).
type Fresh = (Arc<WatchCacheEvent>, u16);

/// Errors kept per apply report, at most (the rest are only counted).
const MAX_REPORTED_ERRORS: usize = 16;

/// A handle to one type's cache; clones share it.
#[derive(Clone, Debug)]
pub struct WatchCache {
    pub(crate) shared: Arc<CacheState>,
}

#[derive(Debug)]
pub(crate) struct CacheState {
    pub(crate) config: WatchCacheConfig,
    pub(crate) encoder: FrameEncoder,
    pub(crate) inner: RwLock<Inner>,
    pub(crate) registry: Mutex<Registry>,
    /// `Inner::revision`, readable without the lock.
    revision: AtomicI64,
    pub(crate) waiters: Waiters,
    /// Where the wakers of watchers with new events go (paced by the gateway).
    gate: Arc<WakeGate>,
    /// The wakers `apply` collects, kept from one event to the next (sized by the watchers
    /// registered), so that dispatching allocates nothing per event.
    wake_scratch: Mutex<Vec<Wakeup>>,
    /// Whole-list bodies, shared while a response holds one (`shared_list.rs`).
    pub(crate) lists: super::SharedLists,
}

impl CacheState {
    pub(crate) fn published_revision(&self) -> Revision {
        self.revision.load(Ordering::Acquire)
    }
}

mod read;

pub use read::ListRequest;

#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) state: State,
    /// The newest revision fully applied (events or progress).
    pub(crate) revision: Revision,
    /// The revision of the newest applied event (or of the last relist).
    pub(crate) last_event: Revision,
    pub(crate) ready: bool,
    pub(crate) history: HistoryRing,
    pub(crate) snapshots: SnapshotRing,
    /// Events received from the feed, applied or not (metrics).
    pub(crate) events_received: u64,
    /// Times the cache was (re)filled from a full read (metrics).
    pub(crate) initializations: u64,
}

/// What one `apply` or `replace` did, for logs and metrics.
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub applied: usize,
    /// Events at or below the cache's revision (redelivered), or before the cache was filled.
    pub skipped: usize,
    /// Objects that could not be decoded (they are left out of the cache), first few only.
    pub errors: Vec<ApiError>,
    pub error_count: usize,
    pub evicted: usize,
    pub woken: usize,
}

impl ApplyReport {
    fn error(&mut self, e: ApiError) {
        self.error_count = self.error_count.saturating_add(1);
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(e);
        }
    }
}

/// Sizes and counters, for metrics and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchCacheStats {
    pub revision: Revision,
    pub oldest_revision: Revision,
    pub objects: usize,
    pub history_events: usize,
    /// Bytes charged to the ring: events plus the frames encoded for them.
    pub history_bytes: usize,
    pub snapshots: usize,
    /// Bytes of old objects kept alive only by snapshots (an estimate).
    pub snapshot_bytes: usize,
    pub watchers: usize,
    /// Events received from the store's feed, in total (applied or skipped).
    pub events_received: u64,
    /// Fills from a full read of the store: the first one and every relist.
    pub initializations: u64,
    /// Watchers examined by dispatch, in total.
    pub dispatch_visits: u64,
    pub encoded_json: u64,
    pub encoded_protobuf: u64,
}

pub(crate) fn not_ready() -> ApiError {
    ApiError::TooManyRequests {
        message: "the watch cache is not initialized yet".into(),
        retry_after_seconds: Some(1),
    }
}

pub(crate) fn too_old(requested: Revision, oldest: Revision) -> ApiError {
    ApiError::Expired(format!("too old resource version: {requested} ({oldest})"))
}

impl WatchCache {
    /// The whole lists' bodies shared while a response holds one (`shared_list.rs`).
    pub fn shared_lists(&self) -> &super::SharedLists {
        &self.shared.lists
    }

    /// An empty cache for the type `codec` describes; not ready until [`replace`] fills it.
    ///
    /// [`replace`]: WatchCache::replace
    pub fn new(codec: KindCodec, config: WatchCacheConfig) -> Self {
        Self::with_gate(codec, config, WakeGate::direct())
    }

    /// Like [`new`](WatchCache::new), but watchers are woken through `gate` (shared by
    /// every cache of the gateway, paced by its pacer task).
    pub fn with_gate(codec: KindCodec, config: WatchCacheConfig, gate: Arc<WakeGate>) -> Self {
        WatchCache {
            shared: Arc::new(CacheState {
                config: config.sanitized(),
                encoder: FrameEncoder::new(codec),
                inner: RwLock::new(Inner::default()),
                registry: Mutex::new(Registry::default()),
                wake_scratch: Mutex::new(Vec::new()),
                lists: super::SharedLists::default(),
                revision: AtomicI64::new(0),
                waiters: Waiters::default(),
                gate,
            }),
        }
    }

    pub fn codec(&self) -> &KindCodec {
        &self.shared.encoder.codec
    }

    pub fn config(&self) -> &WatchCacheConfig {
        &self.shared.config
    }

    /// The newest revision the cache has fully applied.
    pub fn revision(&self) -> Revision {
        self.shared.published_revision()
    }

    pub fn is_ready(&self) -> bool {
        self.shared.inner.read().ready
    }

    /// The oldest revision a watch may resume from; older ones get 410.
    pub fn oldest_revision(&self) -> Revision {
        self.shared.inner.read().history.evicted_upto()
    }

    /// Resolves once the cache has applied `revision` (add a timeout around it).
    pub fn wait_for_revision(&self, revision: Revision) -> RevisionWait {
        RevisionWait {
            shared: self.shared.clone(),
            target: revision,
            id: None,
        }
    }

    /// Encodings performed so far in `format` (event frames and bookmarks).
    pub fn encodings(&self, format: FrameFormat) -> u64 {
        self.shared.encoder.stats.encoded(format)
    }

    /// The object's bare protobuf message, encoded once per object (for protobuf lists).
    pub fn object_protobuf(&self, obj: &CachedObject) -> Result<Bytes, ApiError> {
        obj.protobuf(&self.shared.encoder.codec)
    }

    /// (Re)fills the cache from a full read of the type's key range at `revision`: the
    /// start-up fill, and the relist after the feed failed (e.g. compacted). History and
    /// snapshots restart at `revision`; watchers from before are ended with 410, as their
    /// history no longer connects to the new state.
    pub fn replace(&self, kvs: &[KeyValue], revision: Revision, now: Instant) -> ApplyReport {
        let mut report = ApplyReport::default();
        let state = self.ingest_all(kvs, &mut report);
        report.applied = state.len();
        let mut wake = Vec::new();
        {
            let shared = &self.shared;
            let mut guard = shared.inner.write();
            let inner = &mut *guard;
            let mut reg = shared.registry.lock();
            inner.history.reset(revision, &shared.encoder.frame_bytes);
            inner.snapshots.clear();
            inner
                .snapshots
                .maybe_take(revision, &state, now, &shared.config, true);
            inner.state = state;
            inner.revision = revision;
            inner.last_event = revision;
            inner.ready = true;
            inner.initializations = inner.initializations.saturating_add(1);
            reg.expire_all(revision, &mut wake);
            shared.revision.store(revision, Ordering::Release);
        }
        report.woken = wake.len();
        self.wake(&mut wake, revision);
        report
    }

    /// The state a full read describes; what cannot be decoded is left out and reported.
    fn ingest_all(&self, kvs: &[KeyValue], report: &mut ApplyReport) -> State {
        let ingest = self.shared.encoder.codec.ingest;
        let mut state = State::new();
        for kv in kvs {
            match ingest(kv) {
                Ok(obj) => {
                    state.insert(kv.key.clone(), Arc::new(obj));
                }
                Err(e) => report.error(e),
            }
        }
        state
    }

    /// Applies one item of the store's change feed: events update the state, enter the
    /// history ring and are dispatched to the watchers they concern; progress advances the
    /// revision (bookmarks and "wait until fresh" use it). Expired history and snapshots are
    /// dropped on the way. `now` is the clock of the time bounds.
    pub fn apply(&self, item: FeedItem, now: Instant) -> ApplyReport {
        let mut report = ApplyReport::default();
        // Taken, not locked across the apply: another caller meanwhile gets a fresh one.
        let mut wake = std::mem::take(&mut *self.shared.wake_scratch.lock());
        let mut fresh = Vec::new();
        let shared = &self.shared;
        let (revision, watchers) = {
            let mut guard = shared.inner.write();
            let inner = &mut *guard;
            let mut reg = shared.registry.lock();
            match item {
                FeedItem::Progress(rev) if inner.ready => {
                    inner.revision = inner.revision.max(rev);
                }
                FeedItem::Progress(_) => report.skipped = report.skipped.saturating_add(1),
                FeedItem::Events(events) => {
                    inner.events_received =
                        inner.events_received.saturating_add(events.len() as u64);
                    let applied_before = report.applied;
                    for ev in &events {
                        fresh.extend(self.apply_event_locked(
                            inner,
                            &mut reg,
                            ev,
                            now,
                            &mut report,
                            &mut wake,
                        ));
                    }
                    if report.applied > applied_before {
                        inner.snapshots.maybe_take(
                            inner.revision,
                            &inner.state,
                            now,
                            &shared.config,
                            false,
                        );
                    }
                }
            }
            report.evicted = self.evict_locked(inner, &mut reg, now, &mut wake);
            shared.revision.store(inner.revision, Ordering::Release);
            (inner.revision, reg.len())
        };
        // The frames the woken watchers will need are encoded here, outside the locks and
        // before they run: on the ingest thread, where the ring's other long-lived data is
        // allocated, rather than on whichever request thread drains first.
        for (event, frames) in fresh {
            shared.encoder.prepare(&event, frames);
        }
        report.woken = wake.len();
        self.wake(&mut wake, revision);
        // Kept at about the watchers registered: what a burst of them grew goes with them.
        if wake.capacity() > watchers.max(64).saturating_mul(2) {
            wake.shrink_to(watchers);
        }
        *self.shared.wake_scratch.lock() = wake;
        report
    }

    /// Drops history and snapshots past their windows without new input (the ingest task
    /// calls this on a timer when the feed is idle; `apply` does it too).
    pub fn prune(&self, now: Instant) -> usize {
        let mut wake = Vec::new();
        let shared = &self.shared;
        let (evicted, revision) = {
            let mut guard = shared.inner.write();
            let inner = &mut *guard;
            let mut reg = shared.registry.lock();
            (
                self.evict_locked(inner, &mut reg, now, &mut wake),
                inner.revision,
            )
        };
        self.wake(&mut wake, revision);
        evicted
    }

    fn apply_event_locked(
        &self,
        inner: &mut Inner,
        reg: &mut Registry,
        ev: &Event,
        now: Instant,
        report: &mut ApplyReport,
        wake: &mut Vec<Wakeup>,
    ) -> Option<Fresh> {
        let rev = ev.revision();
        if !inner.ready || rev <= inner.revision {
            report.skipped = report.skipped.saturating_add(1);
            return None;
        }
        let key = &ev.kv.key;
        let prev = inner.state.get(&key[..]).cloned();
        // The cache's own previous object is the one watchers last saw, so transitions are
        // judged against it (and no second decode of `prev_kv` is needed).
        let (event_type, object) = match ev.kind {
            EventKind::Put => match (self.shared.encoder.codec.ingest)(&ev.kv) {
                Ok(obj) => {
                    let obj = Arc::new(obj);
                    inner.state.insert(key.clone(), obj.clone());
                    let ty = if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    };
                    (ty, obj)
                }
                Err(e) => {
                    // Left out rather than served half-decoded; the store validated it on
                    // write, so this is corruption, reported to the ingest task's log.
                    report.error(e);
                    inner.revision = rev;
                    return None;
                }
            },
            EventKind::Delete => match inner.state.remove(&key[..]) {
                Some(obj) => (EventType::Deleted, obj),
                None => {
                    // Never seen (or left out as undecodable): nothing to tell anyone.
                    inner.revision = rev;
                    report.skipped = report.skipped.saturating_add(1);
                    return None;
                }
            },
        };
        report.applied = report.applied.saturating_add(1);
        self.push_event_locked(inner, reg, event_type, object, prev, rev, now, wake)
    }

    /// Records one change in the history, dispatches it and moves the revision to `rev`;
    /// returns the event with the frames its watchers will need, if any.
    #[allow(clippy::too_many_arguments)]
    fn push_event_locked(
        &self,
        inner: &mut Inner,
        reg: &mut Registry,
        event_type: EventType,
        object: Arc<CachedObject>,
        prev: Option<Arc<CachedObject>>,
        rev: Revision,
        now: Instant,
        wake: &mut Vec<Wakeup>,
    ) -> Option<Fresh> {
        let seq = inner.history.next_seq();
        let prev = if event_type == EventType::Deleted {
            Some(object.clone())
        } else {
            prev
        };
        let event = Arc::new(WatchCacheEvent::new(
            event_type, object, prev, rev, seq, now,
        ));
        inner.snapshots.note_event(rev, event.prev.as_deref());
        let frames = reg.dispatch(
            &event,
            inner.history.first_seq(),
            inner.history.evicted_upto(),
            self.shared.config.watcher_queue_limit,
            wake,
        );
        let fresh = (frames != 0).then(|| (event.clone(), frames));
        inner.history.push(event);
        inner.revision = rev;
        inner.last_event = rev;
        fresh
    }

    /// Brings a filled cache to a new full read at `revision` (a relist after the feed's start
    /// was compacted away) without ending its watchers: the differences from the cached state
    /// become ordinary events. Objects added or changed come first, in the order of their own
    /// resourceVersions (kept above the cache's revision, so a watch resumes past them);
    /// objects gone come last, at `revision`, as no read says when they went. Then every
    /// watcher that takes bookmarks gets one at `revision` at once. An empty cache is filled
    /// by [`WatchCache::replace`] instead.
    pub fn resync(&self, kvs: &[KeyValue], revision: Revision, now: Instant) -> ApplyReport {
        if !self.is_ready() {
            return self.replace(kvs, revision, now);
        }
        let mut report = ApplyReport::default();
        let fresh = self.ingest_all(kvs, &mut report);
        let mut wake = Vec::new();
        let shared = &self.shared;
        let revision = {
            let mut guard = shared.inner.write();
            let inner = &mut *guard;
            let mut reg = shared.registry.lock();
            if revision <= inner.revision {
                report.skipped = report.skipped.saturating_add(kvs.len());
                return report;
            }
            let mut changed: Vec<(Bytes, Arc<CachedObject>)> = fresh
                .iter()
                .filter(|(k, obj)| {
                    inner
                        .state
                        .get(&k[..])
                        .is_none_or(|old| old.resource_version != obj.resource_version)
                })
                .map(|(k, obj)| (k.clone(), obj.clone()))
                .collect();
            changed.sort_by_key(|(_, obj)| obj.resource_version);
            let gone: Vec<Bytes> = inner
                .state
                .keys()
                .filter(|k| !fresh.contains_key(&k[..]))
                .cloned()
                .collect();
            let mut stamp = inner.revision;
            for (key, obj) in changed {
                stamp = obj.resource_version.clamp(stamp, revision);
                let prev = inner.state.insert(key, obj.clone());
                let ty = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                self.push_event_locked(inner, &mut reg, ty, obj, prev, stamp, now, &mut wake);
                report.applied = report.applied.saturating_add(1);
            }
            for key in gone {
                if let Some(obj) = inner.state.remove(&key[..]) {
                    self.push_event_locked(
                        inner,
                        &mut reg,
                        EventType::Deleted,
                        obj,
                        None,
                        revision,
                        now,
                        &mut wake,
                    );
                    report.applied = report.applied.saturating_add(1);
                }
            }
            inner.revision = revision;
            inner.last_event = revision;
            inner
                .snapshots
                .maybe_take(revision, &inner.state, now, &shared.config, false);
            report.evicted = self.evict_locked(inner, &mut reg, now, &mut wake);
            // Every watcher is told the new revision at once: one that only waits for its
            // next periodic bookmark would, if its connection broke meanwhile, resume from
            // before the resync, a revision the source may no longer serve.
            reg.bookmark_all(&mut wake);
            shared.revision.store(revision, Ordering::Release);
            revision
        };
        report.woken = wake.len();
        self.wake(&mut wake, revision);
        report
    }

    fn evict_locked(
        &self,
        inner: &mut Inner,
        reg: &mut Registry,
        now: Instant,
        wake: &mut Vec<Wakeup>,
    ) -> usize {
        let shared = &self.shared;
        let evicted = inner
            .history
            .evict(now, &shared.config, &shared.encoder.frame_bytes);
        if evicted > 0 {
            reg.expire_lagging(
                inner.history.first_seq(),
                inner.history.evicted_upto(),
                wake,
            );
        }
        inner.snapshots.prune(now, &shared.config);
        evicted
    }

    fn wake(&self, wake: &mut Vec<Wakeup>, revision: Revision) {
        self.shared.gate.wake(wake);
        self.shared.waiters.wake(revision);
    }

    /// Registers a watch. Fails with 410 if `After(rv)` is older than the ring, 504 if it is
    /// newer than the cache (wait first), 406 for a format the type cannot be encoded in,
    /// 429 when `max_watchers` are registered.
    pub fn watch(&self, req: WatchRequest, now: Instant) -> Result<Watcher, ApiError> {
        let codec = &self.shared.encoder.codec;
        match req.format {
            FrameFormat::Protobuf if codec.protobuf.is_none() => {
                return Err(ApiError::NotAcceptable(format!(
                    "{} cannot be watched as protobuf",
                    codec.info.kind
                )));
            }
            _ => {}
        }
        let filter = WatchFilter::new(
            req.namespace.as_deref(),
            req.selector.clone(),
            codec.info.namespaced(),
        );
        self.register(filter, &req, now)
    }

    /// Registers a watch of `filter` (the namespace and selector of `req` already in it).
    pub(crate) fn register(
        &self,
        mut filter: WatchFilter,
        req: &WatchRequest,
        now: Instant,
    ) -> Result<Watcher, ApiError> {
        let codec = &self.shared.encoder.codec;
        let range = self.key_range(req.namespace.as_deref());
        let inner = self.shared.inner.read();
        if !inner.ready {
            return Err(not_ready());
        }
        let start = match req.start {
            WatchStart::Ahead(rv) if rv > inner.revision => {
                filter.after = rv;
                WatchStart::Now
            }
            WatchStart::Ahead(rv) => WatchStart::After(rv),
            other => other,
        };
        let (catchup, initial, synced) = match start {
            WatchStart::Now => (None, None, inner.revision.max(filter.after)),
            WatchStart::Ahead(_) => (None, None, inner.revision.max(filter.after)),
            WatchStart::InitialEvents { .. } => {
                (None, Some((inner.state.clone(), range)), inner.revision)
            }
            WatchStart::After(rv) => {
                let oldest = inner.history.evicted_upto();
                if rv < oldest {
                    return Err(too_old(rv, oldest));
                }
                if rv > inner.revision {
                    return Err(ApiError::too_large_resource_version(rv, inner.revision));
                }
                let iv =
                    WatchCacheInterval::new(inner.history.seq_after(rv), inner.history.next_seq());
                ((!iv.is_done()).then_some(iv), None, rv)
            }
        };
        // Registered under the state lock, so no event falls between the start point
        // (snapshot or interval end) and the first dispatch to this watcher.
        let mut reg = self.shared.registry.lock();
        if reg.len() >= self.shared.config.max_watchers {
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "too many watches of {} ({} registered)",
                    codec.info.plural,
                    reg.len()
                ),
                retry_after_seconds: Some(1),
            });
        }
        let slot = Arc::new(WatcherSlot {
            filter,
            state: Mutex::new(SlotState {
                catchup,
                queue: VecDeque::with_capacity(QUEUE_START),
                format: req.format.index() as u8,
                ..SlotState::default()
            }),
        });
        let id = reg.insert(slot.clone());
        drop(reg);
        drop(inner);
        Ok(Watcher::new(
            self.clone(),
            slot,
            id,
            req,
            initial,
            synced,
            now,
        ))
    }

    pub fn stats(&self) -> WatchCacheStats {
        let shared = &self.shared;
        let inner = shared.inner.read();
        let reg = shared.registry.lock();
        WatchCacheStats {
            revision: inner.revision,
            oldest_revision: inner.history.evicted_upto(),
            objects: inner.state.len(),
            history_events: inner.history.len(),
            history_bytes: inner
                .history
                .base_bytes()
                .saturating_add(shared.encoder.frame_bytes.load(Ordering::Acquire)),
            snapshots: inner.snapshots.len(),
            snapshot_bytes: inner.snapshots.pinned_bytes(),
            watchers: reg.len(),
            events_received: inner.events_received,
            initializations: inner.initializations,
            dispatch_visits: reg.visits,
            encoded_json: shared.encoder.stats.encoded(FrameFormat::Json),
            encoded_protobuf: shared.encoder.stats.encoded(FrameFormat::Protobuf),
        }
    }
}
