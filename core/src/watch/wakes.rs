//! Paced wake-ups for watchers: the [`WakeGate`] every cache hands its woken watchers to.
//!
//! Dispatching one event to 10,000 watchers wakes 10,000 tasks at once. On a work-stealing
//! runtime they fill the worker's local queue and spill into the shared queue, and every task
//! woken after them (a write's handler resumed by the store's committer, the ingest task
//! resumed by the change feed) waits behind the whole round: a write's latency then grows
//! with the number of watchers, and so does the delay before the next event is even
//! dispatched. The gate keeps the round out of the runtime's queues: a burst of at most
//! `slice` wakers is woken at once while the gate is idle (so an idle server adds no
//! latency), the rest wait in the gate's FIFO, and the gateway's pacer task wakes them
//! `slice` at a time, yielding to the runtime between slices. Other tasks then wait behind at
//! most a slice, whatever the number of watchers.
//!
//! Pacing also batches: a watcher waiting in the gate has no waker registered, so the events
//! dispatched meanwhile only extend its queue, and when it runs it writes all of them in one
//! write. Under load a watcher is woken at most once per round of the backlog; when idle,
//! immediately. The FIFO usually holds at most one waker per registered watcher (dispatch
//! takes a watcher's waker when it queues it; a task that runs for another reason, a timer
//! or its socket, may register a second one meanwhile), and it is capped at
//! [`MAX_DEFERRED`]: past the cap wakers are woken at once, so a wake-up is never lost.
//!
//! Plain `std::task` wakers: core stays runtime-free, the gateway owns the pacer task.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

/// Wakers a gate holds for its pacer, at most (16 bytes each: 4 MiB).
pub const MAX_DEFERRED: usize = 1 << 18;

/// Where the wakers of watchers with new events go (one gate may serve many caches).
#[derive(Debug)]
pub struct WakeGate {
    /// Wakers woken at once when nothing is waiting; `None`: no pacing (everything at once).
    slice: Option<usize>,
    inner: Mutex<GateInner>,
    /// Watcher wake-ups deferred to the pacer, in total (a metric and a test).
    deferred: AtomicU64,
}

#[derive(Debug, Default)]
struct GateInner {
    pending: VecDeque<Waker>,
    pacer: Option<Waker>,
}

impl WakeGate {
    /// A gate that wakes every watcher at once (no pacer needed): tests and benches.
    pub fn direct() -> Arc<Self> {
        Arc::new(WakeGate {
            slice: None,
            inner: Mutex::new(GateInner::default()),
            deferred: AtomicU64::new(0),
        })
    }

    /// A gate that wakes at most `slice` watchers at once; someone must run
    /// [`WakeGate::pace`] for the rest (the gateway's pacer task).
    pub fn paced(slice: usize) -> Arc<Self> {
        Arc::new(WakeGate {
            slice: Some(slice.max(1)),
            inner: Mutex::new(GateInner::default()),
            deferred: AtomicU64::new(0),
        })
    }

    /// Wakes `wakers` now if the gate is idle and they fit in a slice; otherwise wakes what
    /// fits (nothing if others are already waiting: they go first) and queues the rest for
    /// the pacer, in order.
    pub(crate) fn wake(&self, wakers: Vec<Waker>) {
        if wakers.is_empty() {
            return;
        }
        let Some(slice) = self.slice else {
            wakers.into_iter().for_each(Waker::wake);
            return;
        };
        let mut now = wakers;
        let pacer = {
            let mut g = self.inner.lock();
            if g.pending.is_empty() && now.len() <= slice {
                None
            } else {
                let room = MAX_DEFERRED.saturating_sub(g.pending.len());
                let keep = if g.pending.is_empty() { slice } else { 0 };
                // Past the cap the excess is woken at once: paced less, never lost.
                let keep = keep.max(now.len().saturating_sub(room));
                let later = now.split_off(keep.min(now.len()));
                self.deferred
                    .fetch_add(later.len() as u64, Ordering::Relaxed);
                g.pending.extend(later);
                g.pacer.take()
            }
        };
        now.into_iter().for_each(Waker::wake);
        if let Some(p) = pacer {
            p.wake();
        }
    }

    /// Wakes up to one slice of the waiting watchers; returns how many it woke (0: none
    /// waiting). The pacer calls this, yielding to the runtime between calls.
    pub fn release(&self) -> usize {
        let n = self.slice.unwrap_or(usize::MAX);
        let batch: Vec<Waker> = {
            let mut g = self.inner.lock();
            let n = n.min(g.pending.len());
            g.pending.drain(..n).collect()
        };
        let woken = batch.len();
        batch.into_iter().for_each(Waker::wake);
        woken
    }

    /// Resolves when watchers are waiting for the pacer.
    pub fn pace(self: &Arc<Self>) -> Backlog {
        Backlog { gate: self.clone() }
    }

    /// Watchers waiting for the pacer now.
    pub fn waiting(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// Watcher wake-ups that went through the pacer, in total.
    pub fn deferred(&self) -> u64 {
        self.deferred.load(Ordering::Relaxed)
    }
}

/// The future of [`WakeGate::pace`].
#[derive(Debug)]
pub struct Backlog {
    gate: Arc<WakeGate>,
}

impl Future for Backlog {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut g = self.gate.inner.lock();
        if !g.pending.is_empty() {
            return Poll::Ready(());
        }
        if !g.pacer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            g.pacer = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn wakers(n: usize) -> (Arc<Count>, Vec<Waker>) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = (0..n).map(|_| Waker::from(c.clone())).collect();
        (c, w)
    }

    fn woken(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn an_idle_gate_wakes_a_slice_at_once_and_queues_the_rest_for_the_pacer() {
        let gate = WakeGate::paced(4);
        let (c, w) = wakers(3);
        gate.wake(w);
        assert_eq!(woken(&c), 3);
        assert_eq!(gate.waiting(), 0);

        let (c, w) = wakers(10);
        let (p, pw) = wakers(1);
        let mut backlog = gate.pace();
        let mut cx = Context::from_waker(&pw[0]);
        assert!(Pin::new(&mut backlog).poll(&mut cx).is_pending());
        gate.wake(w);
        assert_eq!(woken(&c), 4, "one slice at once");
        assert_eq!(gate.waiting(), 6);
        assert_eq!(woken(&p), 1, "the pacer is told");
        assert!(Pin::new(&mut backlog).poll(&mut cx).is_ready());

        // While some wait, newcomers queue behind them.
        let (c2, w2) = wakers(2);
        gate.wake(w2);
        assert_eq!(woken(&c2), 0);
        assert_eq!(gate.release(), 4);
        assert_eq!(woken(&c), 8);
        assert_eq!(gate.release(), 4);
        assert_eq!((woken(&c), woken(&c2)), (10, 2));
        assert_eq!(gate.release(), 0);
        assert_eq!(gate.deferred(), 8);
    }

    #[test]
    fn past_its_cap_the_gate_wakes_at_once_instead_of_queueing() {
        let gate = WakeGate::paced(1);
        let (c, w) = wakers(MAX_DEFERRED + 1);
        gate.wake(w);
        assert_eq!((woken(&c), gate.waiting()), (1, MAX_DEFERRED));
        let (c2, w2) = wakers(10);
        gate.wake(w2);
        assert_eq!(woken(&c2), 10, "no room: woken at once");
        assert_eq!(gate.waiting(), MAX_DEFERRED);
    }

    #[test]
    fn a_direct_gate_wakes_everything_at_once() {
        let gate = WakeGate::direct();
        let (c, w) = wakers(10_000);
        gate.wake(w);
        assert_eq!(woken(&c), 10_000);
        assert_eq!(gate.waiting(), 0);
    }
}
