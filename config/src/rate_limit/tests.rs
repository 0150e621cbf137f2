//! Tests of the EventRateLimit limiter on an injected clock: the spec's burst 10 / qps 3
//! example exactly, per-type keys, and LRU eviction.

use super::*;
use crate::event_rate_limit::Limit;
use svc_core::kinds::{Event, ObjectReference};

const SEC: u64 = 1_000_000_000;

fn config(limits: &[(&str, i32, i32, Option<i32>)]) -> Configuration {
    Configuration {
        limits: limits
            .iter()
            .map(|(t, qps, burst, cache)| Limit {
                type_: t.to_string(),
                qps: *qps,
                burst: *burst,
                cache_size: *cache,
            })
            .collect(),
        ..Default::default()
    }
}

fn event(controller: &str, object: &str) -> Event {
    Event {
        reporting_controller: controller.into(),
        reporting_instance: format!("{controller}-1"),
        regarding: ObjectReference {
            kind: "Pod".into(),
            namespace: "ns".into(),
            name: object.into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn subject<'a>(namespace: &'a str, user: &'a str, event: &'a Event) -> Subject<'a> {
    Subject {
        namespace,
        user,
        event,
    }
}

/// Accepts at `now` until refused; returns how many were accepted (bounded).
fn drain(limiter: &EventRateLimiter, s: &Subject<'_>, now: u64) -> usize {
    (0..1000)
        .take_while(|_| limiter.check(s, now).is_ok())
        .count()
}

#[test]
fn burst_10_qps_3_is_the_spec_example_exactly() {
    let mut b = TokenBucket::full(3, 10, 0);
    // t=0: 10 accepted, the 11th refused (a third of a second until the next).
    for i in 0..10 {
        assert_eq!(b.try_take(0), Ok(()), "request {i} at t=0");
    }
    assert_eq!(b.try_take(0), Err(Duration::from_nanos(333_333_334)));
    // t=1s: 3 more, then refused.
    for i in 0..3 {
        assert_eq!(b.try_take(SEC), Ok(()), "request {i} at t=1s");
    }
    assert!(b.try_take(SEC).is_err());
    // Fractions carry: at t=1s + 1/3 s exactly one more.
    assert_eq!(b.try_take(SEC + 333_333_334), Ok(()));
    assert!(b.try_take(SEC + 333_333_334).is_err());
    // Idle 10s: full again at 10, not more.
    let later = 12 * SEC;
    assert_eq!(b.available(later), 10);
    for i in 0..10 {
        assert_eq!(b.try_take(later), Ok(()), "request {i} after idling");
    }
    assert!(b.try_take(later).is_err());
    // A clock that steps back adds nothing.
    assert!(b.try_take(SEC).is_err());
}

#[test]
fn the_limiter_keeps_the_same_table() {
    let l = EventRateLimiter::new(&config(&[(SERVER, 3, 10, None)]), 0);
    let e = event("kubelet", "p");
    let s = subject("ns", "alice", &e);
    assert_eq!(drain(&l, &s, 0), 10);
    let refused = l.check(&s, 0).unwrap_err();
    assert_eq!(refused.message, "limit reached on type Server for key ");
    assert_eq!(refused.retry_after, Duration::from_nanos(333_333_334));
    assert_eq!(drain(&l, &s, SEC), 3);
    assert_eq!(drain(&l, &s, 11 * SEC), 10);
}

#[test]
fn each_type_keys_its_buckets() {
    let e1 = event("kubelet", "p1");
    let e2 = event("kubelet", "p2");
    let e3 = event("scheduler", "p1");
    for (type_, same, different) in [
        // (subject a, b charged to one bucket) and (a, c to two)
        (
            NAMESPACE,
            (subject("a", "u1", &e1), subject("a", "u2", &e2)),
            subject("b", "u1", &e1),
        ),
        (
            USER,
            (subject("a", "u1", &e1), subject("b", "u1", &e2)),
            subject("a", "u2", &e1),
        ),
        (
            SOURCE_AND_OBJECT,
            (subject("a", "u1", &e1), subject("b", "u2", &e1)),
            subject("a", "u1", &e2),
        ),
        (
            SERVER,
            (subject("a", "u1", &e1), subject("b", "u2", &e3)),
            subject("a", "u1", &e1),
        ),
    ] {
        let l = EventRateLimiter::new(&config(&[(type_, 1, 2, None)]), 0);
        let (a, b) = same;
        assert!(l.check(&a, 0).is_ok(), "{type_}");
        assert!(l.check(&b, 0).is_ok(), "{type_}");
        assert!(l.check(&a, 0).is_err(), "{type_}: a and b share a bucket");
        if type_ != SERVER {
            assert!(
                l.check(&different, 0).is_ok(),
                "{type_}: another key, another bucket"
            );
        }
    }
    let e = event("scheduler", "p1");
    assert_eq!(
        key_of(SOURCE_AND_OBJECT, &subject("a", "u", &e)),
        "scheduler\0scheduler-1\0\0\0Pod\0ns\0p1\0\0"
    );
    // Another object or another source is another key.
    assert_ne!(
        key_of(SOURCE_AND_OBJECT, &subject("a", "u", &e1)),
        key_of(SOURCE_AND_OBJECT, &subject("a", "u", &e3))
    );
}

#[test]
fn every_limit_is_charged_and_the_refusal_names_each() {
    let l = EventRateLimiter::new(&config(&[(NAMESPACE, 1, 1, None), (USER, 1, 2, None)]), 0);
    let e = event("c", "o");
    assert!(l.check(&subject("a", "u", &e), 0).is_ok());
    // The namespace bucket refuses, and the user bucket is charged anyway (as Kubernetes).
    let r = l.check(&subject("a", "u", &e), 0).unwrap_err();
    assert_eq!(r.message, "limit reached on type Namespace for key a");
    let r = l.check(&subject("b", "u", &e), 0).unwrap_err();
    assert_eq!(r.message, "limit reached on type User for key u");
    let r = l.check(&subject("a", "u", &e), 0).unwrap_err();
    assert_eq!(
        r.message,
        "[limit reached on type Namespace for key a, limit reached on type User for key u]"
    );
    assert_eq!(r.retry_after, Duration::from_secs(1));
}

#[test]
fn the_lru_evicts_the_least_recently_used_and_an_evicted_bucket_restarts_full() {
    let l = EventRateLimiter::new(&config(&[(NAMESPACE, 1, 2, Some(2))]), 0);
    let e = event("c", "o");
    // a and b use up their allowance.
    assert_eq!(drain(&l, &subject("a", "u", &e), 0), 2);
    assert_eq!(drain(&l, &subject("b", "u", &e), 0), 2);
    // Touch a (still refused), so b is the least recently used; c evicts b.
    assert!(l.check(&subject("a", "u", &e), 0).is_err());
    assert!(l.check(&subject("c", "u", &e), 0).is_ok());
    assert_eq!(l.buckets(NAMESPACE), 2);
    // a was kept and is still empty (and now most recent, so c goes next).
    assert!(l.check(&subject("a", "u", &e), 0).is_err());
    // b comes back full.
    assert_eq!(drain(&l, &subject("b", "u", &e), 0), 2);
    assert_eq!(l.buckets(NAMESPACE), 2);
}

#[test]
fn the_lru_holds_at_most_its_capacity() {
    let mut lru: Lru<u32> = Lru::new(3);
    for (i, k) in ["a", "b", "c", "d", "a", "e"].iter().enumerate() {
        *lru.get_or_insert_with(k, || 0) += i as u32;
        assert!(lru.len() <= 3);
    }
    // d evicted a, a's return evicted b, e evicted c.
    assert!(!lru.contains("b") && !lru.contains("c"));
    assert_eq!(
        *lru.get_or_insert_with("a", || 99),
        4,
        "a restarted at its return"
    );
    assert_eq!(*lru.get_or_insert_with("d", || 99), 3);
    assert_eq!(*lru.get_or_insert_with("e", || 99), 5);
    let mut one: Lru<u8> = Lru::new(0);
    one.get_or_insert_with("x", || 1);
    one.get_or_insert_with("y", || 2);
    assert_eq!((one.len(), one.contains("y")), (1, true));
}

#[test]
fn large_rates_do_not_overflow() {
    let mut b = TokenBucket::full(i32::MAX as u32, i32::MAX as u32, 0);
    assert_eq!(b.available(u64::MAX), i32::MAX as u64);
    assert!(b.try_take(u64::MAX).is_ok());
}

#[test]
fn a_fractional_rate_refills_to_the_thousandth() {
    const SECOND: u64 = 1_000_000_000;
    let mut b = TokenBucket::full_at_rate(0.5, 1, 0);
    assert!(b.try_take(0).is_ok());
    // Half a request a second: the next one is two seconds away, not one (integer `qps`
    // would have rounded the rate to 0 or 1).
    assert_eq!(b.try_take(0), Err(Duration::from_secs(2)));
    assert!(b.try_take(SECOND).is_err());
    assert!(b.try_take(2 * SECOND).is_ok());
    // A rate below a thousandth is kept at one thousandth rather than never refilling.
    let mut slow = TokenBucket::full_at_rate(0.0, 1, 0);
    assert!(slow.try_take(0).is_ok());
    assert_eq!(slow.try_take(0), Err(Duration::from_secs(1000)));
}
