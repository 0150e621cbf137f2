//! Overload protection as Kubernetes' `--max-requests-inflight` and
//! `--max-mutating-requests-inflight` give it: at most so many read-only and so many mutating
//! requests in flight at once; past that, 429 with `Retry-After`. Long-running requests
//! (watches) and `system:masters` (the server's own controllers, administrators) are not
//! counted, as in Kubernetes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A bound on requests in flight (0: none).
#[derive(Debug)]
pub struct InflightLimit {
    max: usize,
    current: AtomicUsize,
}

/// A place in flight, given back when dropped.
#[derive(Debug)]
pub struct Slot<'a>(Option<&'a AtomicUsize>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl InflightLimit {
    pub fn new(max: usize) -> Self {
        InflightLimit {
            max,
            current: AtomicUsize::new(0),
        }
    }

    /// A slot, or `None` when the limit is reached.
    pub fn try_acquire(&self) -> Option<Slot<'_>> {
        if self.max == 0 {
            return Some(Slot(None));
        }
        self.current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < self.max).then_some(c + 1)
            })
            .ok()
            .map(|_| Slot(Some(&self.current)))
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
}
