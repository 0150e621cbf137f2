//! Batch mode (`--audit-*-mode=batch`): events go into a bounded buffer and a task sends them
//! to the backend in batches of up to `batch-max-size`, waiting at most `batch-max-wait` for
//! a batch to fill, at most `batch-throttle-qps` batches a second (bursts of
//! `batch-throttle-burst`) when throttling is on. A request never waits: when the buffer is
//! full the event is dropped and counted in `apiserver_audit_error_total{plugin}`. Batches
//! are sent one at a time, so a stalled backend holds one batch and the buffer, no more.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use svc_config::audit::Event;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Sink;
use crate::base::deadline::Deadline;
use svc_config::rate_limit::TokenBucket;

#[derive(Clone, Debug)]
pub struct BatchConfig {
    pub buffer_size: usize,
    pub max_batch_size: usize,
    pub max_batch_wait: Duration,
    /// (qps, burst) when throttling is on.
    pub throttle: Option<(f32, usize)>,
}

/// A backend behind a bounded buffer.
pub struct Buffered {
    name: &'static str,
    tx: mpsc::Sender<Arc<Event>>,
    stop: tokio::sync::watch::Sender<bool>,
    dropped: prometheus_client::metrics::counter::Counter,
    task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Buffered {
    /// Starts the sending task; `dropped` counts the events the full buffer refused.
    pub fn start(
        inner: Arc<dyn Sink>,
        config: BatchConfig,
        dropped: prometheus_client::metrics::counter::Counter,
        failed: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.buffer_size.max(1));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let name = inner.name();
        let task = tokio::spawn(run(inner, config, rx, stopped, failed));
        Buffered {
            name,
            tx,
            stop,
            dropped,
            task: parking_lot::Mutex::new(Some(task)),
        }
    }

    /// Stops taking events and waits (up to `limit`) for the buffer to be sent.
    pub async fn shutdown(&self, limit: Duration) {
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = self.stop.send(true);
            let _ = tokio::time::timeout(limit, task).await;
        }
    }
}

impl Sink for Buffered {
    fn name(&self) -> &'static str {
        self.name
    }

    fn process<'a>(&'a self, events: &'a [Arc<Event>]) -> BoxFuture<'a, Result<(), String>> {
        for ev in events {
            if self.tx.try_send(ev.clone()).is_err() {
                self.dropped.inc();
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

async fn run(
    inner: Arc<dyn Sink>,
    config: BatchConfig,
    mut rx: mpsc::Receiver<Arc<Event>>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    failed: prometheus_client::metrics::counter::Counter,
) {
    let max = config.max_batch_size.max(1);
    let mut bucket = config
        .throttle
        .map(|(qps, burst)| Throttle::new(qps, burst));
    let mut batch = Vec::with_capacity(max.min(1024));
    let mut closing = false;
    while !closing {
        // The first event, then more until the batch is full or max-wait has passed.
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => batch.push(ev),
                None => closing = true,
            },
            _ = crate::base::lifecycle::until_set(&mut stopped) => closing = true,
        }
        let deadline = Instant::now().later(config.max_batch_wait);
        while !closing && batch.len() < max {
            let next = if config.max_batch_wait.is_zero() {
                rx.try_recv().ok()
            } else {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(ev)) => Some(ev),
                    Ok(None) => {
                        closing = true;
                        None
                    }
                    Err(_) => None,
                }
            };
            match next {
                Some(ev) => batch.push(ev),
                None => break,
            }
        }
        if closing {
            // Whatever is still buffered goes out too.
            while let Ok(ev) = rx.try_recv() {
                batch.push(ev);
            }
        }
        for chunk in batch.chunks(max) {
            if let Some(b) = &mut bucket {
                b.take().await;
            }
            if let Err(e) = inner.process(chunk).await {
                failed.inc_by(chunk.len() as u64);
                tracing::warn!(backend = inner.name(), events = chunk.len(), error = %e, "audit batch not sent");
            }
        }
        batch.clear();
    }
}

/// The batch throttle: core's token bucket (`burst` batches, refilled at `qps` a second),
/// on a monotonic clock of its own.
struct Throttle {
    bucket: TokenBucket,
    origin: Instant,
}

impl Throttle {
    fn new(qps: f32, burst: usize) -> Self {
        let burst = u32::try_from(burst.max(1)).unwrap_or(u32::MAX);
        Throttle {
            bucket: TokenBucket::full_at_rate(f64::from(qps), burst, 0),
            origin: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Waits until a batch may go, and takes its token.
    async fn take(&mut self) {
        loop {
            match self.bucket.try_take(self.now()) {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_config::audit::{Level, Stage};

    fn event(id: usize) -> Arc<Event> {
        Arc::new(Event {
            kind: "Event".into(),
            audit_id: id.to_string(),
            level: Level::Metadata,
            stage: Stage::ResponseComplete,
            api_version: String::new(),
            request_uri: String::new(),
            verb: String::new(),
            user: Default::default(),
            impersonated_user: None,
            source_ips: Vec::new(),
            user_agent: String::new(),
            object_ref: None,
            response_status: None,
            request_object: None,
            response_object: None,
            request_received_timestamp: svc_core::meta::MicroTime::now(),
            stage_timestamp: svc_core::meta::MicroTime::now(),
            annotations: Default::default(),
        })
    }

    /// Records batches; blocks while `stall` is set.
    struct Recorder {
        batches: parking_lot::Mutex<Vec<Vec<String>>>,
        stall: tokio::sync::Semaphore,
    }

    impl Sink for Recorder {
        fn name(&self) -> &'static str {
            "webhook"
        }
        fn process<'a>(&'a self, events: &'a [Arc<Event>]) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                let _permit = self.stall.acquire().await;
                self.batches
                    .lock()
                    .push(events.iter().map(|e| e.audit_id.clone()).collect());
                Ok(())
            })
        }
    }

    fn recorder(open: bool) -> Arc<Recorder> {
        Arc::new(Recorder {
            batches: parking_lot::Mutex::new(Vec::new()),
            stall: tokio::sync::Semaphore::new(if open { 1000 } else { 0 }),
        })
    }

    /// Waits (bounded) until `rec` holds `n` batches.
    async fn batches(rec: &Recorder, n: usize) -> Vec<Vec<String>> {
        for _ in 0..500 {
            if rec.batches.lock().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        rec.batches.lock().clone()
    }

    #[tokio::test]
    async fn events_go_out_in_batches_of_max_size_after_max_wait() {
        let rec = recorder(true);
        let b = Buffered::start(
            rec.clone(),
            BatchConfig {
                buffer_size: 100,
                max_batch_size: 3,
                max_batch_wait: Duration::from_millis(300),
                throttle: None,
            },
            Default::default(),
            Default::default(),
        );
        let evs: Vec<_> = (0..7).map(event).collect();
        let start = Instant::now();
        b.process(&evs).await.unwrap();
        // Two full batches go at once; the last waits for max-wait.
        assert_eq!(batches(&rec, 2).await.len(), 2);
        let got = batches(&rec, 3).await;
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(got, [vec!["0", "1", "2"], vec!["3", "4", "5"], vec!["6"]]);
    }

    #[tokio::test]
    async fn a_stalled_backend_fills_the_buffer_and_drops_are_counted() {
        let rec = recorder(false);
        let dropped = prometheus_client::metrics::counter::Counter::default();
        let b = Buffered::start(
            rec.clone(),
            BatchConfig {
                buffer_size: 5,
                max_batch_size: 2,
                max_batch_wait: Duration::ZERO,
                throttle: Some((10.0, 15)),
            },
            dropped.clone(),
            Default::default(),
        );
        let evs: Vec<_> = (0..20).map(event).collect();
        // The task takes one batch of 2 and stalls sending it; then 5 fit in the buffer.
        b.process(&evs[..2]).await.unwrap();
        for _ in 0..500 {
            if b.tx.capacity() == 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.process(&evs[2..]).await.unwrap();
        assert_eq!(dropped.get(), 13);
        rec.stall.add_permits(100);
        b.shutdown(Duration::from_secs(5)).await;
        let sent: usize = rec.batches.lock().iter().map(Vec::len).sum();
        assert_eq!(sent, 7);
    }

    #[tokio::test]
    async fn throttling_spaces_batches() {
        let rec = recorder(true);
        let b = Buffered::start(
            rec.clone(),
            BatchConfig {
                buffer_size: 100,
                max_batch_size: 1,
                max_batch_wait: Duration::ZERO,
                throttle: Some((5.0, 2)),
            },
            Default::default(),
            Default::default(),
        );
        let evs: Vec<_> = (0..6).map(event).collect();
        let start = Instant::now();
        b.process(&evs).await.unwrap();
        assert_eq!(batches(&rec, 6).await.len(), 6);
        // A burst of 2, then 4 more at 5 a second.
        assert!(
            start.elapsed() >= Duration::from_millis(750),
            "{:?}",
            start.elapsed()
        );
    }
}
