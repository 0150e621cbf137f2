//! Metrics written once per event delivered to each watcher (`apiserver_watch_events_total`,
//! `apiserver_watch_events_sizes`), striped by thread: every request thread adds to a stripe
//! of its own, on a cache line of its own, and a scrape sums the stripes. One shared atomic
//! per metric would be written by every core that delivers events, several times per event
//! and watcher, and the cache line it lives on would travel from core to core with each of
//! those writes: a cost that grows with the cores, not with the work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Stripes per metric. Threads beyond this many share stripes (still correct, since each
/// stripe is an atomic; only their cache lines are shared again).
pub const STRIPES: usize = 16;

/// Buckets a [`SizeHistogram`] may have, its +Inf bucket included; bounds past this many are
/// left out.
pub const MAX_BUCKETS: usize = 16;

/// The next thread's stripe.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's stripe, handed out in turn as threads first record.
    static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

fn stripe() -> usize {
    STRIPE.with(|s| *s)
}

/// A counter striped by thread.
#[derive(Clone, Debug, Default)]
pub struct StripedCounter {
    stripes: Arc<[CachePadded<AtomicU64>; STRIPES]>,
}

impl StripedCounter {
    pub fn inc_by(&self, n: u64) {
        if let Some(s) = self.stripes.get(stripe()) {
            s.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The stripes' sum (wrapping, as a counter's atomic does).
    pub fn get(&self) -> u64 {
        self.stripes
            .iter()
            .fold(0u64, |n, s| n.wrapping_add(s.load(Ordering::Relaxed)))
    }
}

impl TypedMetric for StripedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for StripedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// One thread's share of a [`SizeHistogram`].
#[derive(Debug, Default)]
struct HistogramStripe {
    /// One per bound, then +Inf; not cumulative.
    buckets: [AtomicU64; MAX_BUCKETS],
    sum: AtomicU64,
}

/// A histogram of byte sizes with fixed buckets, updated with atomics only and striped by
/// thread (`prometheus-client`'s `Histogram` takes a lock per observation). Encoded by
/// `prometheus-client` like its own histograms.
#[derive(Clone, Debug)]
pub struct SizeHistogram {
    inner: Arc<SizeHistogramInner>,
}

#[derive(Debug)]
struct SizeHistogramInner {
    /// At most `MAX_BUCKETS - 1` of them.
    bounds: &'static [f64],
    stripes: [CachePadded<HistogramStripe>; STRIPES],
}

impl SizeHistogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        let kept = bounds.len().min(MAX_BUCKETS.saturating_sub(1));
        SizeHistogram {
            inner: Arc::new(SizeHistogramInner {
                bounds: bounds.get(..kept).unwrap_or_default(),
                stripes: Default::default(),
            }),
        }
    }

    pub fn observe_all(&self, sizes: impl Iterator<Item = usize>) {
        let inner = &self.inner;
        let Some(stripe) = inner.stripes.get(stripe()) else {
            return;
        };
        let mut sum = 0u64;
        let mut last: Option<(usize, u64)> = None;
        // Wrapping, as the atomic counters they are added to wrap.
        for size in sizes {
            sum = sum.wrapping_add(size as u64);
            let i = inner.bounds.partition_point(|b| *b < size as f64);
            // Frames of one batch are mostly alike: add runs to the same bucket at once.
            match &mut last {
                Some((j, k)) if *j == i => *k = k.wrapping_add(1),
                _ => {
                    if let Some((j, k)) = last.take()
                        && let Some(bucket) = stripe.buckets.get(j)
                    {
                        bucket.fetch_add(k, Ordering::Relaxed);
                    }
                    last = Some((i, 1));
                }
            }
        }
        // `last` is set once anything was observed.
        if let Some((j, k)) = last {
            if let Some(bucket) = stripe.buckets.get(j) {
                bucket.fetch_add(k, Ordering::Relaxed);
            }
            stripe.sum.fetch_add(sum, Ordering::Relaxed);
        }
    }

    /// Each bucket's count (not cumulative; +Inf last) and the sum, over every stripe.
    fn totals(&self) -> (Vec<u64>, u64) {
        let inner = &self.inner;
        let mut counts = vec![0u64; inner.bounds.len().saturating_add(1)];
        let mut sum = 0u64;
        for s in &inner.stripes {
            for (c, b) in counts.iter_mut().zip(&s.buckets) {
                *c = c.wrapping_add(b.load(Ordering::Relaxed));
            }
            sum = sum.wrapping_add(s.sum.load(Ordering::Relaxed));
        }
        (counts, sum)
    }
}

impl TypedMetric for SizeHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for SizeHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (counts, sum) = self.totals();
        let buckets: Vec<(f64, u64)> = self
            .inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts)
            .collect();
        // The count is the sum of the buckets read, so the two always agree in one scrape.
        let count = buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(sum as f64, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_histogram_counts_each_frame_once() {
        static BOUNDS: [f64; 2] = [10.0, 100.0];
        let h = SizeHistogram::new(&BOUNDS);
        h.observe_all([1usize, 10, 11, 11, 500].into_iter());
        assert_eq!(h.totals(), (vec![2, 2, 1], 533));
    }

    #[test]
    fn threads_record_on_stripes_of_their_own_and_a_scrape_sums_them() {
        static BOUNDS: [f64; 1] = [100.0];
        let h = SizeHistogram::new(&BOUNDS);
        let c = StripedCounter::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        h.observe_all([50usize, 500].into_iter());
                        c.inc_by(2);
                    }
                });
            }
        });
        assert_eq!(h.totals(), (vec![4000, 4000], 4000 * 550));
        assert_eq!(c.get(), 8000);
        let used = h
            .inner
            .stripes
            .iter()
            .filter(|s| s.sum.load(Ordering::Relaxed) > 0)
            .count();
        assert!(used >= 2, "{used} stripes written by 4 threads");
    }

    #[test]
    fn bounds_past_the_buckets_kept_are_left_out_not_overrun() {
        static BOUNDS: [f64; 20] = [
            1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0,
            17.0, 18.0, 19.0, 20.0,
        ];
        let h = SizeHistogram::new(&BOUNDS);
        h.observe_all([1usize, 30].into_iter());
        let (counts, sum) = h.totals();
        assert_eq!(counts.len(), MAX_BUCKETS);
        assert_eq!(counts.iter().sum::<u64>(), 2);
        assert_eq!(counts.last(), Some(&1));
        assert_eq!(sum, 31);
    }
}
