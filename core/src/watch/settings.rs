//! `WatchCacheConfig`: every bound of the watch cache in one place, with defaults that match
//! the Kubernetes cacher where it has one (5 minute history, 75 second list snapshots).

use std::time::Duration;

/// Bounds and windows of one [`WatchCache`](super::WatchCache). Every structure the cache
/// holds is bounded by at least one of these, so memory does not grow with the number of
/// watchers, with a stalled client, or with the write rate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCacheConfig {
    /// How long an event stays in the history ring: the window a watch may resume from.
    pub history_window: Duration,
    /// Upper bound on the ring's bytes (objects plus the frames encoded for them).
    pub history_max_bytes: usize,
    /// Upper bound on the ring's length, whatever the sizes.
    pub history_max_events: usize,
    /// Whether superseded states are kept at all (the `ListFromCacheSnapshot` gate). Without
    /// them, Exact lists and continue tokens are read from the store's history instead.
    pub list_snapshots: bool,
    /// How long a superseded state stays listable (`resourceVersionMatch=Exact`, continue).
    pub snapshot_window: Duration,
    /// At most one snapshot per this interval; revisions in between are rebuilt exactly by
    /// replaying the (few) history events after the snapshot before them.
    pub snapshot_min_interval: Duration,
    /// Upper bound on retained snapshots, whatever their age.
    pub max_snapshots: usize,
    /// Upper bound on the bytes of old objects that only snapshots keep alive; past it the
    /// oldest snapshots go early (continue tokens into them then get 410).
    pub snapshot_max_bytes: usize,
    /// Event references queued per watcher before it falls back to walking the ring itself
    /// (it is not ended then: only falling off the ring ends a watch).
    pub watcher_queue_limit: usize,
    /// How often a watcher that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// Registered watchers per cache; more are refused with 429.
    pub max_watchers: usize,
}

impl Default for WatchCacheConfig {
    fn default() -> Self {
        WatchCacheConfig {
            history_window: Duration::from_secs(5 * 60),
            history_max_bytes: 64 << 20,
            history_max_events: 250_000,
            list_snapshots: true,
            snapshot_window: Duration::from_secs(75),
            snapshot_min_interval: Duration::from_millis(50),
            max_snapshots: 2048,
            snapshot_max_bytes: 128 << 20,
            watcher_queue_limit: 1024,
            bookmark_interval: Duration::from_secs(60),
            max_watchers: 200_000,
        }
    }
}

impl WatchCacheConfig {
    /// The same config with every count at least 1, so a zero from a flag cannot make the
    /// cache drop every event or refuse every watcher by accident.
    pub(crate) fn sanitized(mut self) -> Self {
        self.history_max_events = self.history_max_events.max(1);
        self.history_max_bytes = self.history_max_bytes.max(1);
        self.max_snapshots = self.max_snapshots.max(1);
        self.snapshot_max_bytes = self.snapshot_max_bytes.max(1);
        self.watcher_queue_limit = self.watcher_queue_limit.max(1);
        self.max_watchers = self.max_watchers.max(1);
        self
    }
}
