//! List state: `Snapshot` (an O(1) clone of the persistent ordered map at one revision, the
//! answer to every list) and `SnapshotRing`, the snapshots kept for the list-snapshot window
//! so that `resourceVersionMatch=Exact` lists and continue tokens are served from memory.
//!
//! Granularity: at most one snapshot per `snapshot_min_interval` (taken after an applied
//! batch), at most `max_snapshots`, each kept until `snapshot_window` after it was superseded,
//! and no more than `snapshot_max_bytes` of objects kept alive only by snapshots. (A snapshot
//! alone keeps alive the objects replaced after it and before the next one; that is what is
//! counted, so dropping the oldest snapshot frees what it is charged with.)
//! A revision between two snapshots is rebuilt exactly from the earlier one by replaying the
//! history events in between (at most one interval's worth), so every revision in the window
//! is listable while memory stays bounded by the snapshot count, not by the write rate.

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use imbl::OrdMap;
use svc_storage::{KeyRange, Revision};

use super::cached::{CachedObject, Selector};
use super::settings::WatchCacheConfig;

/// The objects of one revision, by store key. Clones share structure: O(1).
pub type State = OrdMap<Bytes, Arc<CachedObject>>;

/// The objects of a type at exactly one revision.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub revision: Revision,
    pub state: State,
}

/// One page of a list.
#[derive(Clone, Debug, Default)]
pub struct ListResult {
    pub items: Vec<Arc<CachedObject>>,
    /// The revision the list is consistent at (the collection's `resourceVersion`).
    pub revision: Revision,
    /// Set when the page was cut short by the limit: the key to continue after.
    pub continue_after: Option<Bytes>,
    /// With no selector and a cut page: how many objects follow (`remainingItemCount`).
    pub remaining: Option<usize>,
}

impl Snapshot {
    pub fn len(&self) -> usize {
        self.state.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    pub fn get(&self, key: &[u8]) -> Option<&Arc<CachedObject>> {
        self.state.get(key)
    }

    /// One page of the objects in `range` after `start_after` that match `selector`, at most
    /// `limit` of them (None: all).
    ///
    /// Cost: O(log n + scanned). `remaining` is counted by walking the keys after the page
    /// (no decoding, no allocation), O(remaining); on a first page of the whole collection
    /// it is O(1) from the map's size.
    pub fn list(
        &self,
        range: &KeyRange,
        start_after: Option<&[u8]>,
        limit: Option<usize>,
        selector: &Selector,
    ) -> ListResult {
        let lower = match start_after {
            Some(k) if k >= &range.start[..] => Bound::Excluded(k),
            _ => Bound::Included(&range.start[..]),
        };
        let upper = if range.end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(&range.end[..])
        };
        let limit = limit.filter(|l| *l > 0);
        let mut items = Vec::with_capacity(limit.unwrap_or(0).min(4096));
        let mut scanned = 0usize;
        let mut iter = self.state.range::<_, [u8]>((lower, upper)).peekable();
        let mut continue_after = None;
        while let Some((key, obj)) = iter.next() {
            scanned = scanned.saturating_add(1);
            if selector.matches(obj) {
                items.push(obj.clone());
                if limit.is_some_and(|l| items.len() >= l) {
                    if iter.peek().is_some() {
                        continue_after = Some(key.clone());
                    }
                    break;
                }
            }
        }
        let remaining = match (&continue_after, selector.is_empty()) {
            (Some(_), true) if start_after.is_none() && self.range_is_everything(range) => {
                Some(self.state.len().saturating_sub(scanned))
            }
            (Some(_), true) => Some(iter.count()),
            _ => None,
        };
        ListResult {
            items,
            revision: self.revision,
            continue_after,
            remaining,
        }
    }
}

impl Snapshot {
    /// Whether `range` holds every key of the state (both ends inside it): O(log n).
    fn range_is_everything(&self, range: &KeyRange) -> bool {
        let inside =
            |e: Option<&(Bytes, Arc<CachedObject>)>| e.is_none_or(|(k, _)| range.contains(k));
        inside(self.state.get_min()) && inside(self.state.get_max())
    }
}

#[derive(Debug)]
struct SnapshotEntry {
    revision: Revision,
    state: State,
    taken_at: Instant,
    /// The revision of the first event applied after this snapshot, once there is one: the
    /// snapshot is exact for every revision below it without replaying anything.
    next_event: Option<Revision>,
    /// Bytes of objects only this snapshot keeps alive (replaced before the next snapshot).
    pinned: usize,
}

/// Where the state at a revision comes from.
#[derive(Debug)]
pub(crate) enum Found {
    /// This state is exactly the state at the requested revision.
    Exact(State),
    /// Start from this state (at `revision`) and replay the events after it.
    Replay { revision: Revision, state: State },
    /// The revision is older than every kept snapshot.
    Expired,
}

#[derive(Debug, Default)]
pub(crate) struct SnapshotRing {
    entries: VecDeque<SnapshotEntry>,
    /// Sum of `pinned` over the entries (the newest one's is still growing).
    pinned: usize,
}

impl SnapshotRing {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The oldest revision a snapshot list can be served at.
    pub(crate) fn oldest_revision(&self) -> Option<Revision> {
        self.entries.front().map(|e| e.revision)
    }

    /// Bytes of objects kept alive only by snapshots (an estimate, see the module doc).
    pub(crate) fn pinned_bytes(&self) -> usize {
        self.pinned
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.pinned = 0;
    }

    /// Records that an event at `revision` was applied after the newest snapshot, replacing
    /// or deleting `replaced`. That object is now kept alive by the newest snapshot alone if
    /// the snapshot holds it, i.e. if it is not younger than the snapshot.
    pub(crate) fn note_event(&mut self, revision: Revision, replaced: Option<&CachedObject>) {
        if let Some(last) = self.entries.back_mut() {
            last.next_event.get_or_insert(revision);
            if let Some(obj) = replaced.filter(|o| o.resource_version <= last.revision) {
                let bytes = obj.heap_size();
                last.pinned = last.pinned.saturating_add(bytes);
                self.pinned = self.pinned.saturating_add(bytes);
            }
        }
    }

    /// Takes a snapshot of `state` at `revision` unless one was taken less than
    /// `snapshot_min_interval` ago (`force` for the first one after a relist), or snapshots
    /// are off (`list_snapshots`).
    pub(crate) fn maybe_take(
        &mut self,
        revision: Revision,
        state: &State,
        now: Instant,
        config: &WatchCacheConfig,
        force: bool,
    ) {
        if !config.list_snapshots {
            return;
        }
        let due = self.entries.back().is_none_or(|last| {
            now.saturating_duration_since(last.taken_at) >= config.snapshot_min_interval
        });
        if force || due {
            self.entries.push_back(SnapshotEntry {
                revision,
                state: state.clone(),
                taken_at: now,
                next_event: None,
                pinned: 0,
            });
        }
        self.prune(now, config);
    }

    /// Drops snapshots beyond the count or the bytes, and those superseded longer than the
    /// window ago. The newest is kept whatever its age: until the next write it is the
    /// current state.
    pub(crate) fn prune(&mut self, now: Instant, config: &WatchCacheConfig) {
        while self.entries.len() > 1
            && (self.entries.len() > config.max_snapshots
                || self.pinned > config.snapshot_max_bytes
                || self.entries.get(1).is_some_and(|next| {
                    now.saturating_duration_since(next.taken_at) > config.snapshot_window
                }))
        {
            if let Some(e) = self.entries.pop_front() {
                self.pinned = self.pinned.saturating_sub(e.pinned);
            }
        }
    }

    /// The snapshot to serve `revision` from (which must not be newer than the cache).
    pub(crate) fn find(&self, revision: Revision) -> Found {
        let i = self.entries.partition_point(|e| e.revision <= revision);
        let Some(entry) = i.checked_sub(1).and_then(|i| self.entries.get(i)) else {
            return Found::Expired;
        };
        match entry.next_event {
            Some(next) if revision >= next => Found::Replay {
                revision: entry.revision,
                state: entry.state.clone(),
            },
            _ => Found::Exact(entry.state.clone()),
        }
    }
}
