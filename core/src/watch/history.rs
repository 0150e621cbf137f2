//! The history ring (the event half of Kubernetes' `watch_cache.go`): the events of the
//! last few minutes in revision order, bounded by age, bytes and count, addressed by a
//! sequence number so that cursors survive the ring moving and know when they were overrun.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use svc_storage::Revision;

use super::cached::{CachedObject, KindCodec};
use super::frames::EventFrames;
use super::settings::WatchCacheConfig;
use crate::status::ApiError;

/// The type of a watch event as a watcher sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added = 0,
    Modified = 1,
    Deleted = 2,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }

    pub(crate) fn from_bits(bits: u64) -> EventType {
        match bits & 3 {
            0 => EventType::Added,
            1 => EventType::Modified,
            _ => EventType::Deleted,
        }
    }
}

/// One change of one object, as the cache applied it.
#[derive(Debug)]
pub struct WatchCacheEvent {
    /// `Added` for a create, `Modified` for an update, `Deleted` for a delete; a watcher's
    /// selector may turn it into another type (see `WatchFilter::transition`).
    pub event_type: EventType,
    /// The object after the change; for a delete, the object as it was before it.
    pub object: Arc<CachedObject>,
    /// The object before the change (None for a create).
    pub prev: Option<Arc<CachedObject>>,
    pub revision: Revision,
    pub(crate) seq: u64,
    pub(crate) at: Instant,
    /// Bytes charged to the ring for this event, frames excluded (they are charged lazily).
    pub(crate) base_bytes: usize,
    pub(crate) frames: EventFrames,
    /// The previous object re-stamped with this event's revision, for `DELETED` frames.
    deleted: OnceLock<Result<Arc<CachedObject>, Arc<str>>>,
}

impl WatchCacheEvent {
    pub(crate) fn new(
        event_type: EventType,
        object: Arc<CachedObject>,
        prev: Option<Arc<CachedObject>>,
        revision: Revision,
        seq: u64,
        at: Instant,
    ) -> Self {
        // Objects are counted even when the state or a neighbouring event shares them: the
        // ring is what keeps old versions alive once the state has moved on (a `prev` may
        // outlive the event that brought it), so over-counting is the safe side of the bound.
        let prev_bytes = match &prev {
            Some(p) if !Arc::ptr_eq(p, &object) => p.heap_size(),
            _ => 0,
        };
        let base_bytes = std::mem::size_of::<Self>()
            .saturating_add(object.heap_size())
            .saturating_add(prev_bytes);
        WatchCacheEvent {
            event_type,
            object,
            prev,
            revision,
            seq,
            at,
            base_bytes,
            frames: EventFrames::default(),
            deleted: OnceLock::new(),
        }
    }

    /// What a `DELETED` frame of this event carries: the previous object (for a delete, the
    /// deleted one) with `resourceVersion` = this event's revision, as Kubernetes sends it.
    /// Re-encoded once, on first need.
    pub fn deleted_object(&self, codec: &KindCodec) -> Result<Arc<CachedObject>, ApiError> {
        let cell = self.deleted.get_or_init(|| {
            let base = self.prev.as_ref().unwrap_or(&self.object);
            if base.resource_version == self.revision {
                return Ok(base.clone());
            }
            (codec.restamp)(&base.json, self.revision)
                .map(|json| Arc::new(base.with_json(Bytes::from(json), self.revision)))
                .map_err(|e| Arc::from(e.to_string()))
        });
        cell.clone().map_err(|m| ApiError::Internal(m.to_string()))
    }
}

/// The history ring. Sequence numbers are dense and never reused, unlike revisions (which
/// other resource types share), so a position is an index: O(1) lookups.
#[derive(Debug, Default)]
pub(crate) struct HistoryRing {
    events: VecDeque<Arc<WatchCacheEvent>>,
    /// Sequence number of `events[0]`; equal to `next_seq()` when the ring is empty.
    first_seq: u64,
    base_bytes: usize,
    /// Revision of the newest event that has left the ring (or the revision the ring was
    /// reset at): a watch may resume from this revision or later.
    evicted_upto: Revision,
}

/// The ring has moved past a position: the events there are gone (410 for the watcher).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrun {
    /// The oldest revision a watch may still resume from.
    pub oldest_revision: Revision,
}

impl HistoryRing {
    pub(crate) fn next_seq(&self) -> u64 {
        self.first_seq.saturating_add(self.events.len() as u64)
    }

    pub(crate) fn first_seq(&self) -> u64 {
        self.first_seq
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    pub(crate) fn base_bytes(&self) -> usize {
        self.base_bytes
    }

    pub(crate) fn evicted_upto(&self) -> Revision {
        self.evicted_upto
    }

    /// The event at `seq`: `Err` if the ring has moved past it, `None` if not yet written.
    pub(crate) fn get(&self, seq: u64) -> Result<Option<&Arc<WatchCacheEvent>>, Overrun> {
        let Some(offset) = seq.checked_sub(self.first_seq) else {
            return Err(Overrun {
                oldest_revision: self.evicted_upto,
            });
        };
        let Ok(i) = usize::try_from(offset) else {
            return Ok(None);
        };
        Ok(self.events.get(i))
    }

    /// The sequence number of the first event with a revision above `revision`.
    pub(crate) fn seq_after(&self, revision: Revision) -> u64 {
        let after = self.events.partition_point(|e| e.revision <= revision);
        self.first_seq.saturating_add(after as u64)
    }

    /// Events with `after < revision <= upto`, oldest first.
    pub(crate) fn between(
        &self,
        after: Revision,
        upto: Revision,
    ) -> impl Iterator<Item = &Arc<WatchCacheEvent>> {
        let start = self.events.partition_point(|e| e.revision <= after);
        self.events
            .range(start..)
            .take_while(move |e| e.revision <= upto)
    }

    pub(crate) fn push(&mut self, event: Arc<WatchCacheEvent>) {
        self.base_bytes = self.base_bytes.saturating_add(event.base_bytes);
        self.events.push_back(event);
    }

    /// Drops events past any bound: older than the window, beyond the count, or while the
    /// ring (objects plus encoded frames) is over its bytes. Returns how many left.
    pub(crate) fn evict(
        &mut self,
        now: Instant,
        config: &WatchCacheConfig,
        frame_bytes: &AtomicUsize,
    ) -> usize {
        let mut evicted = 0usize;
        while let Some(front) = self.events.front() {
            let too_old = now.saturating_duration_since(front.at) > config.history_window;
            let too_many = self.events.len() > config.history_max_events;
            let total = self
                .base_bytes
                .saturating_add(frame_bytes.load(Ordering::Acquire));
            if !(too_old || too_many || total > config.history_max_bytes) {
                break;
            }
            self.pop_front(frame_bytes);
            evicted = evicted.saturating_add(1);
        }
        evicted
    }

    fn pop_front(&mut self, frame_bytes: &AtomicUsize) {
        if let Some(ev) = self.events.pop_front() {
            self.first_seq = self.first_seq.saturating_add(1);
            self.base_bytes = self.base_bytes.saturating_sub(ev.base_bytes);
            self.evicted_upto = self.evicted_upto.max(ev.revision);
            frame_bytes.fetch_sub(ev.frames.evict(), Ordering::AcqRel);
        }
    }

    /// Empties the ring after a relist: every old position becomes overrun, and watches may
    /// resume from `revision` on.
    pub(crate) fn reset(&mut self, revision: Revision, frame_bytes: &AtomicUsize) {
        while !self.events.is_empty() {
            self.pop_front(frame_bytes);
        }
        self.evicted_upto = revision;
    }
}
