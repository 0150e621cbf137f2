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
//! Grouping: a waker may name its task group (an h2 connection, whose one task drives every
//! watch on it; `Watcher::set_wake_group`). A deferred batch is ordered by group, a slice
//! counts a group as the one task it is and never ends inside one, so the connection's task
//! runs once for all its woken watchers and writes their frames in one write, instead of once
//! (and one write) per watcher when its watchers are spread through the registry; and 50,000
//! watchers on 500 connections are 500 tasks to pace, not 50,000. A group that is already
//! waiting takes the wakers later dispatches defer into its one place in the FIFO: under
//! load each event finds only a few of a connection's watchers idle, and queued one batch
//! behind another they made the connection's task run once per event, a stream or two at a
//! time. Group 0 is no group.
//!
//! Plain `std::task` wakers: core stays runtime-free, the gateway owns the pacer task.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

/// Wakers a gate holds for its pacer, at most (24 bytes each: 6 MiB).
pub const MAX_DEFERRED: usize = 1 << 18;

/// A waker and its task group (0: none).
pub(crate) type Wakeup = (u64, Waker);

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
    /// Tasks waiting for the pacer, in order: indices into `slots` of each entry's first
    /// waker. A group's wakers deferred by any number of dispatches gather in its one entry
    /// (a chain through `slots`), so the group's task runs once for all of them.
    pending: VecDeque<u32>,
    /// Every deferred waker, in one slab (free ones on `free`): deferring allocates nothing
    /// once the slab has grown to the backlog, so the caches' ingest thread, which defers,
    /// does not scatter short-lived blocks among the long-lived ones it allocates.
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Each waiting group's entry (the index of its first slot).
    groups: HashMap<u64, u32>,
    /// Wakers waiting, in every entry.
    wakers: usize,
    /// The most wakers waiting at once since the backlog last emptied.
    peak: usize,
    pacer: Option<Waker>,
}

/// One deferred waker; an entry's first slot also keeps the entry's group and last slot.
#[derive(Debug)]
struct Slot {
    waker: Option<Waker>,
    group: u64,
    next: u32,
    last: u32,
}

/// The end of a chain of slots.
const NONE: u32 = u32::MAX;

/// Slab capacity always kept. More is kept while each backlog fills a quarter of it (under
/// a steady load the slab is not regrown round after round), and let go after one that
/// does not: after the load.
const KEEP_SLOTS: usize = 4096;

impl GateInner {
    fn slot(&mut self, group: u64, waker: Waker) -> u32 {
        let slot = Slot {
            waker: Some(waker),
            group,
            next: NONE,
            last: NONE,
        };
        if let Some(i) = self.free.pop()
            && let Some(s) = self.slots.get_mut(i as usize)
        {
            *s = slot;
            return i;
        }
        self.slots.push(slot);
        // At most MAX_DEFERRED slots, far below u32::MAX.
        u32::try_from(self.slots.len().saturating_sub(1)).unwrap_or(NONE)
    }

    /// Queues wakers behind those waiting; a group already waiting takes them into its entry.
    fn defer(&mut self, later: impl Iterator<Item = Wakeup>) {
        for (group, w) in later {
            self.wakers = self.wakers.saturating_add(1);
            self.peak = self.peak.max(self.wakers);
            let i = self.slot(group, w);
            if group != 0
                && let Some(&head) = self.groups.get(&group)
            {
                let tail = self
                    .slots
                    .get(head as usize)
                    .map_or(head, |s| if s.last == NONE { head } else { s.last });
                if let Some(t) = self.slots.get_mut(tail as usize) {
                    t.next = i;
                }
                if let Some(h) = self.slots.get_mut(head as usize) {
                    h.last = i;
                }
                continue;
            }
            if group != 0 {
                self.groups.insert(group, i);
            }
            self.pending.push_back(i);
        }
    }

    /// Takes the first `tasks` entries' wakers into `out`.
    fn take(&mut self, tasks: usize, out: &mut Vec<Waker>) {
        for _ in 0..tasks {
            let Some(head) = self.pending.pop_front() else {
                break;
            };
            if let Some(group) = self.slots.get(head as usize).map(|s| s.group)
                && group != 0
            {
                self.groups.remove(&group);
            }
            let mut at = head;
            while let Some(s) = self.slots.get_mut(at as usize) {
                if let Some(w) = s.waker.take() {
                    out.push(w);
                    self.wakers = self.wakers.saturating_sub(1);
                }
                self.free.push(at);
                at = s.next;
            }
        }
        // Judged once per backlog, when its last entry goes.
        if self.pending.is_empty() && self.peak > 0 {
            if self.slots.capacity() > KEEP_SLOTS
                && self.peak.saturating_mul(4) < self.slots.capacity()
            {
                // Let what a burst grew go.
                *self = GateInner {
                    pacer: self.pacer.take(),
                    ..GateInner::default()
                };
            }
            self.peak = 0;
        }
    }
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
    /// the pacer, in order of group. A slice is `slice` tasks: the watchers of one group
    /// count as one.
    /// `wakers` is left empty, its capacity kept for the caller's next round.
    pub(crate) fn wake(&self, wakers: &mut Vec<Wakeup>) {
        if wakers.is_empty() {
            return;
        }
        let Some(slice) = self.slice else {
            wakers.drain(..).for_each(|(_, w)| w.wake());
            return;
        };
        let pacer = {
            let mut g = self.inner.lock();
            if g.pending.is_empty() && wakers.len() <= slice {
                None
            } else {
                // A group's watchers together (dispatch visits them in registry order).
                wakers.sort_unstable_by_key(|(group, _)| *group);
                let room = MAX_DEFERRED.saturating_sub(g.wakers);
                let keep = if g.pending.is_empty() {
                    slice_len(wakers.iter(), slice)
                } else {
                    0
                };
                // Past the cap the excess is woken at once: paced less, never lost.
                let keep = keep
                    .max(wakers.len().saturating_sub(room))
                    .min(wakers.len());
                let later = wakers.len().saturating_sub(keep);
                if later == 0 {
                    None
                } else {
                    self.deferred.fetch_add(later as u64, Ordering::Relaxed);
                    g.defer(wakers.drain(keep..));
                    g.pacer.take()
                }
            }
        };
        wakers.drain(..).for_each(|(_, w)| w.wake());
        if let Some(p) = pacer {
            p.wake();
        }
    }

    /// Wakes one slice of the waiting watchers (a slice counts tasks: a group's watchers
    /// are one); returns how many it woke (0: none waiting). The pacer calls this, yielding to the
    /// runtime between calls.
    pub fn release(&self) -> usize {
        let n = self.slice.unwrap_or(usize::MAX);
        let mut batch = Vec::new();
        self.inner.lock().take(n, &mut batch);
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
        self.inner.lock().wakers
    }

    /// Watcher wake-ups that went through the pacer, in total.
    pub fn deferred(&self) -> u64 {
        self.deferred.load(Ordering::Relaxed)
    }
}

/// How many wakers from the front of `wakers` make one slice: at most `slice` tasks, where
/// the wakers of one group (consecutive, as the gate orders them) are one task, since one
/// task polls them all, and each waker of group 0 is a task of its own.
fn slice_len<'a>(wakers: impl Iterator<Item = &'a Wakeup>, slice: usize) -> usize {
    let (mut taken, mut tasks, mut last) = (0usize, 0usize, 0u64);
    for &(group, _) in wakers {
        if group == 0 || group != last {
            if tasks == slice {
                break;
            }
            tasks = tasks.saturating_add(1);
            last = group;
        }
        taken = taken.saturating_add(1);
    }
    taken
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

    fn wakers(n: usize) -> (Arc<Count>, Vec<Wakeup>) {
        grouped(n, |_| 0)
    }

    fn grouped(n: usize, group: impl Fn(usize) -> u64) -> (Arc<Count>, Vec<Wakeup>) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = (0..n).map(|i| (group(i), Waker::from(c.clone()))).collect();
        (c, w)
    }

    fn woken(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn an_idle_gate_wakes_a_slice_at_once_and_queues_the_rest_for_the_pacer() {
        let gate = WakeGate::paced(4);
        let (c, mut w) = wakers(3);
        gate.wake(&mut w);
        assert_eq!(woken(&c), 3);
        assert_eq!(gate.waiting(), 0);

        let (c, mut w) = wakers(10);
        let (p, pw) = wakers(1);
        let mut backlog = gate.pace();
        let mut cx = Context::from_waker(&pw[0].1);
        assert!(Pin::new(&mut backlog).poll(&mut cx).is_pending());
        gate.wake(&mut w);
        assert_eq!(woken(&c), 4, "one slice at once");
        assert_eq!(gate.waiting(), 6);
        assert_eq!(woken(&p), 1, "the pacer is told");
        assert!(Pin::new(&mut backlog).poll(&mut cx).is_ready());

        // While some wait, newcomers queue behind them.
        let (c2, mut w2) = wakers(2);
        gate.wake(&mut w2);
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
        let (c, mut w) = wakers(MAX_DEFERRED + 1);
        gate.wake(&mut w);
        assert_eq!((woken(&c), gate.waiting()), (1, MAX_DEFERRED));
        let (c2, mut w2) = wakers(10);
        gate.wake(&mut w2);
        assert_eq!(woken(&c2), 10, "no room: woken at once");
        assert_eq!(gate.waiting(), MAX_DEFERRED);
    }

    #[test]
    fn a_groups_watchers_are_woken_together_whatever_their_order() {
        // 40 watchers of 4 connections, registered round-robin (as clients spread watches).
        let gate = WakeGate::paced(4);
        let (p, pw) = wakers(1);
        let mut backlog = gate.pace();
        let mut cx = Context::from_waker(&pw[0].1);
        assert!(Pin::new(&mut backlog).poll(&mut cx).is_pending());
        let c: Vec<_> = (0..4)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let mut w: Vec<Wakeup> = (0..40)
            .map(|i| ((i % 4 + 1) as u64, Waker::from(c[i % 4].clone())))
            .collect();
        gate.wake(&mut w);
        // A slice is 4 tasks: the 10 watchers of a connection are one.
        let counts = |c: &[Arc<Count>]| c.iter().map(|c| woken(c)).collect::<Vec<_>>();
        assert_eq!(counts(&c), [10, 10, 10, 10]);
        assert_eq!(woken(&p), 0, "nothing deferred");
        // With six connections, the first slice is four whole ones, the pacer the rest.
        let c: Vec<_> = (0..6)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let mut w: Vec<Wakeup> = (0..60)
            .map(|i| ((i % 6 + 1) as u64, Waker::from(c[i % 6].clone())))
            .collect();
        gate.wake(&mut w);
        assert_eq!(counts(&c), [10, 10, 10, 10, 0, 0]);
        assert_eq!(woken(&p), 1);
        assert_eq!(gate.release(), 20);
        assert_eq!(counts(&c), [10; 6]);
        assert_eq!(gate.release(), 0);
        // Group 0 is no group: plain slices.
        let (c0, mut w0) = grouped(10, |_| 0);
        gate.wake(&mut w0);
        assert_eq!(woken(&c0), 4);
        assert_eq!(gate.release(), 4);
        assert_eq!(gate.release(), 2);
        assert_eq!(woken(&c0), 10);
    }

    #[test]
    fn a_group_deferred_by_many_dispatches_is_woken_once_in_its_first_place() {
        let gate = WakeGate::paced(2);
        let c: Vec<_> = (0..3)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let w = |g: usize| (g as u64 + 1, Waker::from(c[g].clone()));
        // Three tasks while the gate is idle: two now, group 3 waits.
        gate.wake(&mut vec![w(0), w(1), w(2)]);
        assert_eq!(gate.waiting(), 1);
        // Each later dispatch finds one or two watchers of each connection idle.
        for _ in 0..5 {
            gate.wake(&mut vec![w(0), w(1), w(2), w(2)]);
        }
        assert_eq!(gate.waiting(), 21);
        let counts = || c.iter().map(|c| woken(c)).collect::<Vec<_>>();
        // One slice is two tasks: group 3 (first in line, with everything deferred for it
        // since) and group 1, each once.
        assert_eq!(gate.release(), 11 + 5);
        assert_eq!(counts(), [1 + 5, 1, 1 + 10]);
        assert_eq!(gate.release(), 5);
        assert_eq!(counts(), [6, 6, 11]);
        assert_eq!((gate.release(), gate.waiting()), (0, 0));
    }

    #[test]
    fn deferring_reuses_the_slots_a_release_freed_and_a_burst_lets_them_go() {
        let gate = WakeGate::paced(2);
        let c: Vec<_> = (0..10)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let round = |gate: &WakeGate| {
            let mut w: Vec<Wakeup> = (0..100)
                .map(|i| ((i % 10 + 1) as u64, Waker::from(c[i % 10].clone())))
                .collect();
            gate.wake(&mut w);
            assert!(w.is_empty(), "the caller's vector comes back empty");
            while gate.release() > 0 {}
        };
        round(&gate);
        let slots = gate.inner.lock().slots.len();
        assert_eq!(slots, 80, "two groups of ten went at once, eight waited");
        for _ in 0..5 {
            round(&gate);
        }
        assert_eq!(gate.inner.lock().slots.len(), slots, "the same slots again");
        let counts: Vec<usize> = c.iter().map(|c| woken(c)).collect();
        assert_eq!(counts, [60; 10]);
        // A burst past what is kept stays while bursts that size go on, and is let go after
        // a backlog that fills less than a quarter of it.
        for _ in 0..2 {
            let (_, mut many) = grouped(KEEP_SLOTS * 2, |i| i as u64 + 1);
            gate.wake(&mut many);
            assert!(gate.inner.lock().slots.len() > KEEP_SLOTS);
            while gate.release() > 0 {}
            assert!(gate.inner.lock().slots.capacity() > KEEP_SLOTS, "kept");
        }
        round(&gate);
        assert_eq!(gate.inner.lock().slots.capacity(), 0);
        assert_eq!(gate.waiting(), 0);
    }

    #[test]
    fn a_direct_gate_wakes_everything_at_once() {
        let gate = WakeGate::direct();
        let (c, mut w) = wakers(10_000);
        gate.wake(&mut w);
        assert_eq!(woken(&c), 10_000);
        assert_eq!(gate.waiting(), 0);
    }
}
