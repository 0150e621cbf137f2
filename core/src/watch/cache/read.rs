//! The read side of the cache: the current state and the state at a revision as O(1)
//! snapshots, lists and gets. Nothing here holds the state lock longer than a map clone.

use std::sync::Arc;

use svc_storage::{KeyRange, Revision};

use super::{WatchCache, not_ready, too_old};
use crate::status::ApiError;
use crate::watch::cached::{CachedObject, Selector};
use crate::watch::history::EventType;
use crate::watch::snapshots::{Found, ListResult, Snapshot};

/// One list request against the cache.
#[derive(Clone, Copy, Debug)]
pub struct ListRequest<'a> {
    /// None (or empty) for every namespace.
    pub namespace: Option<&'a str>,
    /// None: the current state. Some: exactly this revision (Exact lists, continue tokens).
    pub at: Option<Revision>,
    /// Continue after this key (from `ListResult::continue_after`).
    pub start_after: Option<&'a [u8]>,
    pub limit: Option<usize>,
    pub selector: &'a Selector,
}

impl WatchCache {
    /// The current state, as an O(1) snapshot.
    pub fn snapshot(&self) -> Result<Snapshot, ApiError> {
        let inner = self.shared.inner.read();
        if !inner.ready {
            return Err(not_ready());
        }
        Ok(Snapshot {
            revision: inner.revision,
            state: inner.state.clone(),
        })
    }

    /// The state at exactly `revision`: 410 `Expired` if it is older than the snapshot
    /// window, 504 `Too large resource version` if the cache has not reached it (wait with
    /// [`wait_for_revision`](Self::wait_for_revision) first). O(log n), plus replaying the few
    /// events between the snapshot before `revision` and `revision`.
    pub fn snapshot_at(&self, revision: Revision) -> Result<Snapshot, ApiError> {
        let (base, replay) = {
            let inner = self.shared.inner.read();
            if !inner.ready {
                return Err(not_ready());
            }
            if revision > inner.revision {
                return Err(ApiError::too_large_resource_version(
                    revision,
                    inner.revision,
                ));
            }
            if revision >= inner.last_event {
                return Ok(Snapshot {
                    revision,
                    state: inner.state.clone(),
                });
            }
            let oldest = inner.snapshots.oldest_revision().unwrap_or(inner.revision);
            match inner.snapshots.find(revision) {
                Found::Exact(state) => return Ok(Snapshot { revision, state }),
                Found::Expired => return Err(too_old(revision, oldest)),
                // The events after the snapshot must all still be in the ring.
                Found::Replay { revision: at, .. } if inner.history.evicted_upto() > at => {
                    return Err(too_old(revision, oldest));
                }
                Found::Replay {
                    revision: at,
                    state,
                } => {
                    let events: Vec<_> = inner.history.between(at, revision).cloned().collect();
                    (state, events)
                }
            }
        };
        // Replayed outside the lock: only this request's private copy changes.
        let mut state = base;
        for ev in replay {
            match ev.event_type {
                EventType::Deleted => {
                    state.remove(&ev.object.key[..]);
                }
                _ => {
                    state.insert(ev.object.key.clone(), ev.object.clone());
                }
            }
        }
        Ok(Snapshot { revision, state })
    }

    /// The key range of a namespace (or of the whole type).
    pub fn key_range(&self, namespace: Option<&str>) -> KeyRange {
        KeyRange::prefix(self.shared.encoder.codec.info.prefix(namespace))
    }

    /// One page of a list, from the current state or from the snapshot at `req.at`.
    pub fn list(&self, req: &ListRequest<'_>) -> Result<ListResult, ApiError> {
        let snapshot = match req.at {
            None => self.snapshot()?,
            Some(rev) => self.snapshot_at(rev)?,
        };
        let range = self.key_range(req.namespace);
        Ok(snapshot.list(&range, req.start_after, req.limit, req.selector))
    }

    /// The objects a watch from "now" starts with as synthetic `ADDED` events, and the
    /// revision they are consistent at.
    pub fn initial_events(
        &self,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Result<(Vec<Arc<CachedObject>>, Revision), ApiError> {
        let snapshot = self.snapshot()?;
        let res = snapshot.list(&self.key_range(namespace), None, None, selector);
        Ok((res.items, res.revision))
    }

    /// One object of the current state, and the revision it was read at.
    pub fn get(&self, key: &[u8]) -> Result<(Option<Arc<CachedObject>>, Revision), ApiError> {
        let inner = self.shared.inner.read();
        if !inner.ready {
            return Err(not_ready());
        }
        Ok((inner.state.get(key).cloned(), inner.revision))
    }
}
