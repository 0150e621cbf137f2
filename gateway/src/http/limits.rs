//! Overload protection in the spirit of Kubernetes' API Priority and Fairness, sized by
//! `--max-requests-inflight` (read-only requests) and `--max-mutating-requests-inflight`
//! (mutating ones): each is a pool of seats. A request that finds its pool full waits in its
//! user's queue (at most `--max-queued-requests-per-user` requests per user, at most
//! `--max-queued-users` users and `--max-queued-requests` requests queued at once, each
//! request at most `--max-queue-wait`); a freed seat goes to the next user in turn among
//! those waiting (round-robin, one request each), so a user sending many requests at once
//! gets its share of the seats, not all of them. Past a bound the request gets 429 with
//! `Retry-After`: `queue-full`, or `time-out` when its wait ran out (Kubernetes' reasons).
//! Watches are long-running and hold no seat: they are counted on their own against
//! `--max-watches`. `system:masters` (the server's own controllers, administrators) is exempt
//! from all of it, as Kubernetes' `exempt` priority level is.
//!
//! A list is charged by its width, as Kubernetes' list work estimator does: one seat per
//! `LIST_OBJECTS_PER_SEAT` objects it will go through (the watch cache's count of the kind,
//! or the `limit` when smaller), at least 1 and at most `MAX_LIST_SEATS` or the pool's
//! seats (`list_width`). A list of 10,000 objects holds 10 seats, so one user's big lists
//! cannot fill the pool with work ten times what the seats count; other requests hold 1.
//! Waiting requests are served in turn without skipping: a wide request at the head of the
//! turn waits until enough seats are free, and narrower ones behind it wait with it (it is
//! never starved by a stream of narrow ones).
//!
//! Its metrics, with Kubernetes' APF names, are `observe::metrics::flow`'s.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use prometheus_client::metrics::gauge::Gauge;

pub use crate::observe::metrics::flow::{FlowFamily, FlowMetrics, Rejection};

/// Objects a list goes through per seat it holds (Kubernetes' `objectsPerSeat`).
pub const LIST_OBJECTS_PER_SEAT: usize = 100;
/// The most seats one list holds (Kubernetes' `maximumListSeatsLimit`).
pub const MAX_LIST_SEATS: usize = 10;

/// The seats a list holds: one per `LIST_OBJECTS_PER_SEAT` of the objects it goes through
/// (`stored`, or `limit` when a smaller one is given), between 1 and `MAX_LIST_SEATS`.
pub fn list_width(stored: usize, limit: Option<usize>) -> usize {
    let objects = match limit {
        Some(l) if l > 0 => stored.min(l),
        _ => stored,
    };
    objects
        .div_ceil(LIST_OBJECTS_PER_SEAT)
        .clamp(1, MAX_LIST_SEATS)
}

/// The bounds of one pool.
#[derive(Clone, Copy, Debug)]
pub struct FairConfig {
    /// Seats: requests running at once (0: no limit).
    pub seats: usize,
    /// Requests one user may have waiting (0: no queueing, a full pool rejects at once).
    pub queue_length: usize,
    /// Users that may have requests waiting at once.
    pub max_queues: usize,
    /// Requests that may wait at once, all users together.
    pub max_queued: usize,
    /// Longest wait for a seat.
    pub max_wait: Duration,
}

/// One waiting request: set `granted` (under the pool's lock) and notified when a seat is
/// handed to it.
struct Waiter {
    id: u64,
    /// Seats it needs.
    width: usize,
    granted: AtomicBool,
    wake: Notify,
}

#[derive(Default)]
struct State {
    /// Seats held by running requests.
    running: usize,
    /// Waiting requests per user; only users with at least one.
    queues: HashMap<Arc<str>, VecDeque<Arc<Waiter>>>,
    /// Users with waiting requests, in the order they get the next freed seats.
    turn: VecDeque<Arc<str>>,
    queued: usize,
    next_id: u64,
}

impl State {
    /// Takes `id` out of `user`'s queue; false when it is no longer there (a seat was
    /// handed to it).
    fn remove(&mut self, user: &str, id: u64) -> bool {
        let Some(q) = self.queues.get_mut(user) else {
            return false;
        };
        let Some(i) = q.iter().position(|w| w.id == id) else {
            return false;
        };
        q.remove(i);
        self.queued = self.queued.saturating_sub(1);
        if q.is_empty() {
            self.queues.remove(user);
            self.turn.retain(|u| &**u != user);
        }
        true
    }

    /// The next waiting request in round-robin order across users, if it needs no more
    /// than `free` seats (else it stays first in line).
    fn next(&mut self, free: usize) -> Option<Arc<Waiter>> {
        while let Some(user) = self.turn.pop_front() {
            let Some(q) = self.queues.get_mut(&user) else {
                continue;
            };
            if q.front().is_some_and(|w| w.width > free) {
                self.turn.push_front(user);
                return None;
            }
            let w = q.pop_front();
            if q.is_empty() {
                self.queues.remove(&user);
            } else {
                self.turn.push_back(user);
            }
            if let Some(w) = w {
                self.queued = self.queued.saturating_sub(1);
                return Some(w);
            }
        }
        None
    }
}

/// A pool of seats with fair queuing by user.
pub struct FairLimit {
    level: &'static str,
    cfg: FairConfig,
    state: parking_lot::Mutex<State>,
    metrics: FlowMetrics,
    /// This pool's gauges of the families in `metrics`, looked up once.
    inqueue: Gauge,
    executing: Gauge,
}

/// A request's seats (one, or a list's width), given back (to the next waiting users in
/// turn) when dropped.
pub struct Seat<'a>(Option<(&'a FairLimit, usize)>);

impl Seat<'_> {
    /// Seats held (0 in a pool without a limit).
    pub fn width(&self) -> usize {
        self.0.map_or(0, |(_, w)| w)
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        if let Some((l, width)) = self.0 {
            l.release(width);
        }
    }
}

/// A request in a queue; if its future is dropped (the client went away), it leaves the
/// queue, or gives back the seat it was handed meanwhile.
struct Queued<'a> {
    limit: &'a FairLimit,
    user: Arc<str>,
    waiter: Arc<Waiter>,
    settled: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let removed = self.limit.state.lock().remove(&self.user, self.waiter.id);
        if removed {
            self.limit.inqueue().dec();
        } else if self.waiter.granted.load(Ordering::Acquire) {
            self.limit.release(self.waiter.width);
        }
    }
}

impl FairLimit {
    pub fn new(level: &'static str, cfg: FairConfig, metrics: FlowMetrics) -> Self {
        let (inqueue, executing) = metrics.level_gauges(level);
        FairLimit {
            level,
            cfg,
            state: parking_lot::Mutex::new(State::default()),
            inqueue,
            executing,
            metrics,
        }
    }

    fn inqueue(&self) -> &Gauge {
        &self.inqueue
    }

    fn executing(&self) -> &Gauge {
        &self.executing
    }

    /// A seat for a request of `user`: at once when one is free, else after waiting in the
    /// user's queue for its turn; or why not (counted in the metrics).
    pub async fn acquire(&self, user: &str) -> Result<Seat<'_>, Rejection> {
        self.acquire_width(user, 1).await
    }

    /// `width` seats (at least 1, at most the pool's) for a request of `user`: at once when
    /// they are free and nobody waits, else after waiting in the user's queue for its turn.
    pub async fn acquire_width(&self, user: &str, width: usize) -> Result<Seat<'_>, Rejection> {
        if self.cfg.seats == 0 {
            return Ok(Seat(None));
        }
        let width = width.clamp(1, self.cfg.seats);
        let since = Instant::now();
        let (user, waiter) = {
            let mut st = self.state.lock();
            if st.queued == 0 && st.running.saturating_add(width) <= self.cfg.seats {
                st.running = st.running.saturating_add(width);
                drop(st);
                self.executing().inc();
                return Ok(Seat(Some((self, width))));
            }
            let refused = if self.cfg.queue_length == 0 {
                Some(Rejection::ConcurrencyLimit)
            } else {
                match st.queues.get(user) {
                    _ if st.queued >= self.cfg.max_queued => Some(Rejection::QueueFull),
                    Some(q) if q.len() >= self.cfg.queue_length => Some(Rejection::QueueFull),
                    None if st.queues.len() >= self.cfg.max_queues => Some(Rejection::QueueFull),
                    _ => None,
                }
            };
            if let Some(why) = refused {
                drop(st);
                self.metrics.rejected(self.level, why);
                return Err(why);
            }
            // Ids only tell waiters apart; a u64 does not wrap in a process's life.
            st.next_id = st.next_id.wrapping_add(1);
            let waiter = Arc::new(Waiter {
                id: st.next_id,
                width,
                granted: AtomicBool::new(false),
                wake: Notify::new(),
            });
            let user: Arc<str> = match st.queues.get_key_value(user) {
                Some((k, _)) => k.clone(),
                None => {
                    let k: Arc<str> = Arc::from(user);
                    st.turn.push_back(k.clone());
                    k
                }
            };
            st.queues
                .entry(user.clone())
                .or_default()
                .push_back(waiter.clone());
            st.queued = st.queued.saturating_add(1);
            (user, waiter)
        };
        self.inqueue().inc();
        let mut queued = Queued {
            limit: self,
            user,
            waiter,
            settled: false,
        };
        // `Notify` keeps the permit of a wake-up that comes before this await.
        let _ = tokio::time::timeout(self.cfg.max_wait, queued.waiter.wake.notified()).await;
        queued.settled = true;
        let timed_out = {
            let mut st = self.state.lock();
            st.remove(&queued.user, queued.waiter.id)
        };
        if timed_out {
            self.inqueue().dec();
            self.metrics.waited(self.level, false, since);
            self.metrics.rejected(self.level, Rejection::TimeOut);
            return Err(Rejection::TimeOut);
        }
        // Handed its seats (`release` already counted them as running and it as out of the
        // queue).
        self.metrics.waited(self.level, true, since);
        let width = queued.waiter.width;
        Ok(Seat(Some((self, width))))
    }

    /// Gives `width` seats back, then hands the free seats to the waiting requests in turn
    /// while the next one fits.
    fn release(&self, width: usize) {
        let mut granted = 0u32;
        {
            let mut st = self.state.lock();
            st.running = st.running.saturating_sub(width);
            loop {
                let free = self.cfg.seats.saturating_sub(st.running);
                let Some(w) = st.next(free) else { break };
                st.running = st.running.saturating_add(w.width);
                w.granted.store(true, Ordering::Release);
                w.wake.notify_one();
                granted = granted.saturating_add(1);
            }
        }
        self.executing().dec();
        for _ in 0..granted {
            self.executing().inc();
            self.inqueue().dec();
        }
    }

    /// Seats held by running requests now.
    pub fn in_flight(&self) -> usize {
        self.state.lock().running
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.state.lock().queued
    }
}

/// A plain bound on things in flight (0: none): watches against `--max-watches`.
#[derive(Debug)]
pub struct InflightLimit {
    max: usize,
    current: Arc<AtomicUsize>,
}

/// A place in flight, given back when dropped; owned, so a response body can carry it.
#[derive(Debug)]
pub struct Slot(Option<Arc<AtomicUsize>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl InflightLimit {
    pub fn new(max: usize) -> Self {
        InflightLimit {
            max,
            current: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A slot, or `None` when the limit is reached.
    pub fn try_acquire(&self) -> Option<Slot> {
        if self.max == 0 {
            return Some(Slot(None));
        }
        self.current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < self.max).then(|| c.saturating_add(1))
            })
            .ok()
            .map(|_| Slot(Some(self.current.clone())))
    }

    pub fn in_flight(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_given_back() {
        let l = InflightLimit::new(2);
        let a = l.try_acquire().unwrap();
        let b = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        drop(a);
        let c = l.try_acquire().unwrap();
        assert_eq!(l.in_flight(), 2);
        drop((b, c));
        assert_eq!(l.in_flight(), 0);
        let unlimited = InflightLimit::new(0);
        let held: Vec<_> = (0..1000)
            .map(|_| unlimited.try_acquire().unwrap())
            .collect();
        assert_eq!((held.len(), unlimited.in_flight()), (1000, 0));
    }

    fn pool(seats: usize, queue_length: usize, max_queues: usize, wait_ms: u64) -> FairLimit {
        FairLimit::new(
            "readOnly",
            FairConfig {
                seats,
                queue_length,
                max_queues,
                max_queued: 1000,
                max_wait: Duration::from_millis(wait_ms),
            },
            FlowMetrics::default(),
        )
    }

    #[tokio::test]
    async fn freed_seats_go_round_robin_across_users() {
        let l = Arc::new(pool(1, 10, 10, 10_000));
        let held = l.acquire("a").await.unwrap();
        // User a queues three requests before b queues one: b still gets the second seat.
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, user) in ["a", "a", "a", "b"].into_iter().enumerate() {
            let (l2, order) = (l.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let seat = l2.acquire(user).await.unwrap();
                order.lock().push(format!("{user}{i}"));
                tokio::task::yield_now().await;
                drop(seat);
            }));
            while l.queued() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!((l.in_flight(), l.queued()), (1, 4));
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), ["a0", "b3", "a1", "a2"]);
        assert_eq!((l.in_flight(), l.queued()), (0, 0));
        let inq = l.inqueue().get();
        assert_eq!((inq, l.executing().get()), (0, 0));
    }

    #[tokio::test]
    async fn queues_are_bounded_per_user_and_in_number() {
        let l = Arc::new(pool(1, 2, 2, 10_000));
        let _held = l.acquire("a").await.unwrap();
        let mut waiting = Vec::new();
        for user in ["a", "a", "b"] {
            let l2 = l.clone();
            waiting.push(tokio::spawn(
                async move { l2.acquire(user).await.map(drop) },
            ));
            let n = waiting.len();
            while l.queued() < n {
                tokio::task::yield_now().await;
            }
        }
        // a's queue is full; a third user finds no queue free; b may still queue.
        assert_eq!(l.acquire("a").await.err(), Some(Rejection::QueueFull));
        assert_eq!(l.acquire("c").await.err(), Some(Rejection::QueueFull));
        let l2 = l.clone();
        waiting.push(tokio::spawn(async move { l2.acquire("b").await.map(drop) }));
        while l.queued() < 4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(l.acquire("b").await.err(), Some(Rejection::QueueFull));
        // A client that goes away leaves its queue.
        for w in waiting {
            w.abort();
            let _ = w.await;
        }
        assert_eq!(l.queued(), 0);
        assert_eq!(l.inqueue().get(), 0);
        let text = {
            let mut r = prometheus_client::registry::Registry::default();
            for (name, help, m) in l.metrics.families() {
                r.register(name, help, m);
            }
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
            s
        };
        assert!(
            text.contains(
                "apiserver_flowcontrol_rejected_requests_total{priority_level=\"readOnly\",\
                 reason=\"queue-full\"} 3"
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn many_users_wait_together_up_to_the_bound_on_requests() {
        let l = Arc::new(FairLimit::new(
            "mutating",
            FairConfig {
                seats: 1,
                queue_length: 5,
                max_queues: 4096,
                max_queued: 300,
                max_wait: Duration::from_secs(10),
            },
            FlowMetrics::default(),
        ));
        let held = l.acquire("admin").await.unwrap();
        // Three hundred nodes, a request each: every one waits for its turn.
        let mut waiting = Vec::new();
        for i in 0..300 {
            let l2 = l.clone();
            waiting.push(tokio::spawn(async move {
                l2.acquire(&format!("system:node:n{i}")).await.map(drop)
            }));
        }
        while l.queued() < 300 {
            tokio::task::yield_now().await;
        }
        // Past the bound on requests, a new user is refused, as is one more of a waiting one.
        assert_eq!(
            l.acquire("system:node:n300").await.err(),
            Some(Rejection::QueueFull)
        );
        assert_eq!(
            l.acquire("system:node:n0").await.err(),
            Some(Rejection::QueueFull)
        );
        drop(held);
        for w in waiting {
            assert!(w.await.unwrap().is_ok());
        }
        assert_eq!((l.queued(), l.in_flight()), (0, 0));
    }

    #[tokio::test]
    async fn a_request_waits_at_most_the_bound_and_no_queue_rejects_at_once() {
        let l = pool(1, 5, 5, 50);
        let held = l.acquire("a").await.unwrap();
        let t0 = Instant::now();
        assert_eq!(l.acquire("b").await.err(), Some(Rejection::TimeOut));
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert_eq!((l.queued(), l.in_flight()), (0, 1));
        drop(held);
        assert_eq!(l.in_flight(), 0);
        let strict = pool(1, 0, 5, 50);
        let _held = strict.acquire("a").await.unwrap();
        assert_eq!(
            strict.acquire("b").await.err(),
            Some(Rejection::ConcurrencyLimit)
        );
        let unlimited = pool(0, 0, 0, 0);
        let seats: Vec<_> = futures::future::join_all((0..100).map(|_| unlimited.acquire("a")))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!((seats.len(), unlimited.in_flight()), (100, 0));
    }

    #[tokio::test]
    async fn a_seat_handed_to_a_request_that_went_away_is_given_back() {
        let l = Arc::new(pool(1, 5, 5, 10_000));
        let held = l.acquire("a").await.unwrap();
        let l2 = l.clone();
        // Never polled again after queueing: the seat is handed to it, then it is dropped.
        let mut fut = Box::pin(async move { l2.acquire("b").await.map(drop) });
        assert!(futures::poll!(&mut fut).is_pending());
        assert_eq!(l.queued(), 1);
        drop(held);
        assert_eq!((l.queued(), l.in_flight()), (0, 1));
        drop(fut);
        assert_eq!((l.queued(), l.in_flight()), (0, 0));
        assert_eq!((l.inqueue().get(), l.executing().get()), (0, 0));
    }

    #[test]
    fn a_list_is_as_wide_as_the_objects_it_goes_through() {
        assert_eq!(list_width(0, None), 1);
        assert_eq!(list_width(1, None), 1);
        assert_eq!(list_width(100, None), 1);
        assert_eq!(list_width(101, None), 2);
        assert_eq!(list_width(950, None), 10);
        assert_eq!(list_width(10_000, None), MAX_LIST_SEATS);
        // A page goes through its limit's worth, at most what is stored.
        assert_eq!(list_width(10_000, Some(500)), 5);
        assert_eq!(list_width(50, Some(500)), 1);
        assert_eq!(list_width(10_000, Some(0)), MAX_LIST_SEATS);
    }

    #[tokio::test]
    async fn a_wide_request_holds_its_seats_and_at_most_the_pool() {
        let l = Arc::new(pool(8, 10, 10, 10_000));
        let wide = l.acquire_width("a", 10).await.unwrap();
        assert_eq!((wide.width(), l.in_flight()), (8, 8));
        let l2 = l.clone();
        let narrow = tokio::spawn(async move { l2.acquire("b").await.map(|s| s.width()) });
        while l.queued() < 1 {
            tokio::task::yield_now().await;
        }
        drop(wide);
        assert_eq!(narrow.await.unwrap(), Ok(1));
        assert_eq!((l.in_flight(), l.queued()), (0, 0));
        assert_eq!((l.inqueue().get(), l.executing().get()), (0, 0));
        let five = l.acquire_width("a", 5).await.unwrap();
        let three = l.acquire_width("b", 3).await.unwrap();
        assert_eq!(l.in_flight(), 8);
        drop((five, three));
        assert_eq!(l.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_wide_request_first_in_turn_is_not_passed_by_narrow_ones() {
        let l = Arc::new(pool(4, 10, 10, 10_000));
        let held = l.acquire("x").await.unwrap();
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, (user, width)) in [("a", 4), ("b", 1), ("c", 1)].into_iter().enumerate() {
            let (l2, order) = (l.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let seat = l2.acquire_width(user, width).await.unwrap();
                order.lock().push(user);
                drop(seat);
            }));
            while l.queued() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        // Three seats are free, but a needs four and is first: b and c wait behind it.
        assert_eq!((l.in_flight(), l.queued()), (1, 3));
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        // a ran first; b and c were handed seats together when it finished.
        let mut order = order.lock().clone();
        assert_eq!(order.remove(0), "a");
        order.sort_unstable();
        assert_eq!(order, ["b", "c"]);
        assert_eq!((l.in_flight(), l.queued()), (0, 0));
        assert_eq!((l.inqueue().get(), l.executing().get()), (0, 0));
    }

    #[tokio::test]
    async fn freeing_a_wide_request_hands_its_seats_to_several_waiting() {
        let l = Arc::new(pool(4, 10, 10, 10_000));
        let wide = l.acquire_width("a", 4).await.unwrap();
        let mut waiting = Vec::new();
        for user in ["b", "c", "d"] {
            let l2 = l.clone();
            waiting.push(tokio::spawn(async move {
                let seat = l2.acquire(user).await.unwrap();
                // Held until the test has seen all three run at once.
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(seat);
            }));
            let n = waiting.len();
            while l.queued() < n {
                tokio::task::yield_now().await;
            }
        }
        drop(wide);
        assert_eq!((l.in_flight(), l.queued()), (3, 0));
        assert_eq!((l.inqueue().get(), l.executing().get()), (0, 3));
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!((l.in_flight(), l.executing().get()), (0, 0));
    }
}
