//! The EventRateLimit limiter, without I/O: token buckets (`qps` added per second up to
//! `burst`, starting full), an LRU of buckets per limit type, and the key each type charges an
//! event to. Time is passed in (nanoseconds from any fixed origin), so tests drive a clock of
//! their own and the gateway passes a monotonic one.
//!
//! Kubernetes' rules, kept here: every limit is charged for every event (one refusing does not
//! spare the others); a bucket evicted from its LRU comes back full; `Server` is one bucket.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::event_rate_limit::{Configuration, Limit, NAMESPACE, SERVER, SOURCE_AND_OBJECT, USER};
use svc_core::kinds::Event;

/// Allowance is counted in trillionths of a request, so that a rate of `milli_qps`
/// thousandths of a request per second is `milli_qps` units per nanosecond and the
/// arithmetic is exact.
const UNIT: u128 = 1_000_000_000_000;

/// A token bucket: starts with `burst`, gains `qps` per second up to `burst`, and each accepted
/// request takes one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    /// The refill rate in thousandths of a request per second.
    milli_qps: u64,
    burst: u64,
    /// Allowance in units of `1 / UNIT` requests.
    units: u128,
    last: u64,
}

impl TokenBucket {
    /// A full bucket at time `now` (nanoseconds).
    pub fn full(qps: u32, burst: u32, now: u64) -> Self {
        TokenBucket {
            milli_qps: u64::from(qps).saturating_mul(1000),
            burst: u64::from(burst),
            units: u128::from(burst) * UNIT,
            last: now,
        }
    }

    /// A full bucket at time `now` refilled at a rate that may be fractional (`0.5` is one
    /// request every two seconds), kept to the thousandth and at least that.
    pub fn full_at_rate(qps: f64, burst: u32, now: u64) -> Self {
        // `as` saturates (NaN gives 0): a rate beyond u64 thousandths is as good as unlimited.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let milli_qps = (qps * 1000.0).round() as u64;
        TokenBucket {
            milli_qps: milli_qps.max(1),
            ..Self::full(0, burst, now)
        }
    }

    fn refill(&mut self, now: u64) {
        // A clock that steps back adds nothing rather than wrapping.
        let elapsed = now.saturating_sub(self.last);
        self.last = self.last.max(now);
        let cap = u128::from(self.burst) * UNIT;
        let added = u128::from(elapsed).saturating_mul(u128::from(self.milli_qps));
        self.units = self.units.saturating_add(added).min(cap);
    }

    /// Takes one request's allowance at `now`, or says how long until there is one.
    pub fn try_take(&mut self, now: u64) -> Result<(), Duration> {
        self.refill(now);
        if let Some(left) = self.units.checked_sub(UNIT) {
            self.units = left;
            return Ok(());
        }
        let missing = UNIT.saturating_sub(self.units);
        let rate = u128::from(self.milli_qps.max(1));
        let nanos = missing.div_ceil(rate);
        Err(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }

    /// Whole requests' allowance at `now` (for tests and metrics).
    pub fn available(&mut self, now: u64) -> u64 {
        self.refill(now);
        u64::try_from(self.units / UNIT).unwrap_or(u64::MAX)
    }
}

const NIL: usize = usize::MAX;

struct Node<V> {
    key: Box<str>,
    value: V,
    prev: usize,
    next: usize,
}

/// A least-recently-used map from string keys, holding at most `capacity` entries: adding
/// one more evicts the entry used longest ago. A hit allocates nothing.
pub struct Lru<V> {
    capacity: usize,
    index: HashMap<Box<str>, usize>,
    nodes: Vec<Node<V>>,
    /// Most recently used.
    head: usize,
    /// Least recently used: evicted first.
    tail: usize,
}

impl<V> Lru<V> {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Lru {
            capacity,
            index: HashMap::with_capacity(capacity.min(4096)),
            nodes: Vec::with_capacity(capacity.min(4096)),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    // Links are indices into `nodes`; `NIL` (never an index) ends the list.
    fn unlink(&mut self, i: usize) {
        let Some(node) = self.nodes.get(i) else {
            return;
        };
        let (prev, next) = (node.prev, node.next);
        match self.nodes.get_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.nodes.get_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        let head = self.head;
        if let Some(node) = self.nodes.get_mut(i) {
            node.prev = NIL;
            node.next = head;
        }
        if let Some(old) = self.nodes.get_mut(head) {
            old.prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// The entry for `key`, made most recently used; created with `make` when absent
    /// (evicting the least recently used entry when full).
    pub fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        if let Some(&i) = self.index.get(key) {
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            return self.value_at(i);
        }
        let i = if self.nodes.len() < self.capacity {
            self.nodes.push(Node {
                key: key.into(),
                value: make(),
                prev: NIL,
                next: NIL,
            });
            self.nodes.len().saturating_sub(1)
        } else {
            // Reuse the least recently used slot (the map is full and capacity is at least 1,
            // so there is one).
            let i = self.tail;
            self.unlink(i);
            if let Some(node) = self.nodes.get_mut(i) {
                let old = std::mem::replace(&mut node.key, key.into());
                node.value = make();
                self.index.remove(&old);
            }
            i
        };
        self.index.insert(key.into(), i);
        self.push_front(i);
        self.value_at(i)
    }

    fn value_at(&mut self, i: usize) -> &mut V {
        // Every index in `index`, `head` and `tail` is below `nodes.len()`: nodes are only
        // pushed or reused in place, never removed.
        #[allow(clippy::indexing_slicing)]
        let value = &mut self.nodes[i].value;
        value
    }
}

/// What an event is charged to: its namespace, who sends it, and the event itself.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub user: &'a str,
    pub event: &'a Event,
}

/// An event refused by one or more limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `limit reached on type Namespace for key team-a`; several refusing limits read
    /// `[clause, clause]`.
    pub message: String,
    /// The longest wait until every refusing bucket has allowance again.
    pub retry_after: Duration,
}

enum Buckets {
    Single(TokenBucket),
    Lru(Lru<TokenBucket>),
}

struct Enforcer {
    type_: &'static str,
    qps: u32,
    burst: u32,
    buckets: Mutex<Buckets>,
}

impl Enforcer {
    fn new(limit: &Limit, now: u64) -> Option<Self> {
        let type_ = match limit.type_.as_str() {
            SERVER => SERVER,
            NAMESPACE => NAMESPACE,
            USER => USER,
            SOURCE_AND_OBJECT => SOURCE_AND_OBJECT,
            _ => return None,
        };
        let qps = u32::try_from(limit.qps).ok().filter(|q| *q > 0)?;
        let burst = u32::try_from(limit.burst).ok().filter(|b| *b > 0)?;
        let buckets = if type_ == SERVER {
            Buckets::Single(TokenBucket::full(qps, burst, now))
        } else {
            Buckets::Lru(Lru::new(limit.effective_cache_size()))
        };
        Some(Enforcer {
            type_,
            qps,
            burst,
            buckets: Mutex::new(buckets),
        })
    }

    fn accept(&self, key: &str, now: u64) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock();
        match &mut *buckets {
            Buckets::Single(b) => b.try_take(now),
            Buckets::Lru(lru) => lru
                .get_or_insert_with(key, || TokenBucket::full(self.qps, self.burst, now))
                .try_take(now),
        }
    }
}

/// The key of `subject` under limit type `type_`.
pub fn key_of<'a>(type_: &str, subject: &Subject<'a>) -> std::borrow::Cow<'a, str> {
    match type_ {
        NAMESPACE => subject.namespace.into(),
        USER => subject.user.into(),
        SOURCE_AND_OBJECT => {
            let e = subject.event;
            let r = &e.regarding;
            // NUL cannot appear in any of these fields, so distinct tuples never collide.
            [
                e.reporting_controller.as_str(),
                &e.reporting_instance,
                &e.deprecated_source.component,
                &e.deprecated_source.host,
                &r.kind,
                &r.namespace,
                &r.name,
                &r.uid,
                &r.api_version,
            ]
            .join("\0")
            .into()
        }
        _ => "".into(),
    }
}

/// Every configured limit, each with its buckets.
pub struct EventRateLimiter {
    enforcers: Vec<Enforcer>,
}

impl EventRateLimiter {
    /// The limiter of a validated configuration, its buckets full at `now`. Limits with an
    /// unknown type or non-positive rates (refused by validation) are left out.
    pub fn new(config: &Configuration, now: u64) -> Self {
        EventRateLimiter {
            enforcers: config
                .limits
                .iter()
                .filter_map(|l| Enforcer::new(l, now))
                .collect(),
        }
    }

    /// Charges one event to every limit at `now`; refused if any limit has no allowance left.
    pub fn check(&self, subject: &Subject<'_>, now: u64) -> Result<(), Refusal> {
        let mut refusal: Option<Refusal> = None;
        let mut several = false;
        for enforcer in &self.enforcers {
            let key = key_of(enforcer.type_, subject);
            if let Err(wait) = enforcer.accept(&key, now) {
                let clause = format!(
                    "limit reached on type {} for key {}",
                    enforcer.type_,
                    key.replace('\0', "")
                );
                match &mut refusal {
                    None => {
                        refusal = Some(Refusal {
                            message: clause,
                            retry_after: wait,
                        })
                    }
                    Some(r) => {
                        r.message = format!("{}, {clause}", r.message);
                        r.retry_after = r.retry_after.max(wait);
                        several = true;
                    }
                }
            }
        }
        match refusal {
            None => Ok(()),
            // Several refusals read as Go prints an aggregate error.
            Some(mut r) if several => {
                r.message = format!("[{}]", r.message);
                Err(r)
            }
            Some(r) => Err(r),
        }
    }

    /// How many buckets limit `type_` holds now (tests: LRU bounds).
    pub fn buckets(&self, type_: &str) -> usize {
        self.enforcers
            .iter()
            .filter(|e| e.type_ == type_)
            .map(|e| match &*e.buckets.lock() {
                Buckets::Single(_) => 1,
                Buckets::Lru(l) => l.len(),
            })
            .sum()
    }
}

#[cfg(test)]
mod tests;
