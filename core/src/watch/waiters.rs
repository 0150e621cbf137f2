//! "Wait until fresh": futures that resolve once the cache has applied a given revision, for
//! consistent ("Most Recent") reads and for watches or lists from a version the cache has not
//! reached yet. Plain `std::task` wakers, so core stays runtime-free; the caller adds the
//! timeout (and answers 504 `Too large resource version` when it fires).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use svc_storage::Revision;

use super::cache::CacheState;
use crate::status::ApiError;

/// Waits registered at once, at most; more are refused with 429 (the gateway's request
/// limits keep far below this).
const MAX_WAITERS: usize = 65_536;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    list: Mutex<WaitList>,
}

#[derive(Debug, Default)]
struct WaitList {
    next_id: u64,
    waiting: Vec<(u64, Revision, Waker)>,
}

impl Waiters {
    /// Wakes every wait whose target `revision` has reached. Called after the revision is
    /// published, so a wait that registers later sees the new revision itself.
    pub(crate) fn wake(&self, revision: Revision) {
        let ready: Vec<Waker> = {
            let mut l = self.list.lock();
            if l.waiting.is_empty() {
                return;
            }
            let mut ready = Vec::new();
            l.waiting.retain(|(_, target, w)| {
                let done = *target <= revision;
                if done {
                    ready.push(w.clone());
                }
                !done
            });
            ready
        };
        for w in ready {
            w.wake();
        }
    }

    fn remove(&self, id: u64) {
        self.list.lock().waiting.retain(|(i, _, _)| *i != id);
    }
}

/// The future of [`WatchCache::wait_for_revision`](super::WatchCache::wait_for_revision).
#[derive(Debug)]
pub struct RevisionWait {
    pub(crate) shared: Arc<CacheState>,
    pub(crate) target: Revision,
    pub(crate) id: Option<u64>,
}

impl Future for RevisionWait {
    type Output = Result<(), ApiError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.shared.published_revision() >= self.target {
            return Poll::Ready(Ok(()));
        }
        let shared = self.shared.clone();
        let mut l = shared.waiters.list.lock();
        // Checked again under the lock: `wake` runs after publishing, under this same lock.
        if shared.published_revision() >= self.target {
            return Poll::Ready(Ok(()));
        }
        let target = self.target;
        match self.id {
            Some(id) => {
                if let Some(e) = l.waiting.iter_mut().find(|(i, _, _)| *i == id) {
                    if !e.2.will_wake(cx.waker()) {
                        e.2 = cx.waker().clone();
                    }
                    return Poll::Pending;
                }
                l.waiting.push((id, target, cx.waker().clone()));
            }
            None => {
                if l.waiting.len() >= MAX_WAITERS {
                    return Poll::Ready(Err(ApiError::TooManyRequests {
                        message: "too many requests are waiting for the watch cache".into(),
                        retry_after_seconds: Some(1),
                    }));
                }
                let id = l.next_id;
                // Ids only tell waiters apart; a u64 does not wrap in a process's life.
                l.next_id = l.next_id.wrapping_add(1);
                l.waiting.push((id, target, cx.waker().clone()));
                self.id = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for RevisionWait {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.shared.waiters.remove(id);
        }
    }
}
