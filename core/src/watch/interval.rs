//! `WatchCacheInterval`: a bounded cursor into the history ring (Kubernetes'
//! `watch_cache_interval.go`). It walks the events in `[next, end)` by sequence number and
//! reports [`Overrun`] once the ring has moved past it, which is the 410 case for a watcher.

use std::sync::Arc;

use super::history::{HistoryRing, Overrun, WatchCacheEvent};

/// The events a watcher still has to look at, by sequence number: `[next, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchCacheInterval {
    next: u64,
    end: u64,
}

impl WatchCacheInterval {
    pub(crate) fn new(next: u64, end: u64) -> Self {
        WatchCacheInterval {
            next,
            end: end.max(next),
        }
    }

    /// The sequence number of the next event to look at.
    pub fn position(&self) -> u64 {
        self.next
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    pub fn is_done(&self) -> bool {
        self.next >= self.end
    }

    /// Moves the end further (more events to walk); never shrinks the interval.
    pub(crate) fn extend_to(&mut self, end: u64) {
        self.end = self.end.max(end);
    }

    /// The next event, `None` when the interval is exhausted, `Err` if the ring dropped it.
    /// An overrun cursor stays overrun: it does not skip ahead, as skipping would lose events.
    pub(crate) fn next<'a>(
        &mut self,
        ring: &'a HistoryRing,
    ) -> Result<Option<&'a Arc<WatchCacheEvent>>, Overrun> {
        if self.is_done() {
            return Ok(None);
        }
        match ring.get(self.next)? {
            Some(ev) => {
                self.next = self.next.saturating_add(1);
                Ok(Some(ev))
            }
            // Past the ring's end: the interval was built against a longer ring (cannot
            // happen while sequence numbers only grow); finish rather than spin.
            None => {
                self.next = self.end;
                Ok(None)
            }
        }
    }
}
