//! Bounded, batched export of finished spans: `on_end` only tries to put the span on a bounded
//! queue (a full queue drops it and counts the drop), and one task sends batches to the
//! collector with a deadline per export, so a slow or dead collector never slows a request.
//!
//! The SDK's own batch processor counts its drops but does not expose the count; this one
//! reports it in `apiserver_tracing_dropped_spans_total`.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, oneshot};

use crate::base::deadline::Deadline;

/// Finished spans waiting for export (the Go SDK's default queue size).
pub const QUEUE_CAPACITY: usize = 2048;
/// Spans sent in one export call (the Go SDK's default).
pub const MAX_BATCH: usize = 512;
/// How long a batch waits for more spans before it is sent. Go waits 5 s; a second keeps
/// traces close to live at the cost of more, smaller exports when traffic is light.
pub const BATCH_DELAY: Duration = Duration::from_secs(1);
/// An export that has not finished by then is abandoned and its spans counted as dropped.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// `queue_full` or `export_failed`.
    reason: &'static str,
}

/// Spans that never reached the collector, by reason.
pub type DroppedSpans = Family<DropLabels, Counter>;

impl DropLabels {
    pub fn new(reason: &'static str) -> Self {
        DropLabels { reason }
    }
}

fn count(dropped: &DroppedSpans, reason: &'static str, n: usize) {
    dropped
        .get_or_create(&DropLabels { reason })
        .inc_by(n as u64);
}

/// The span processor: a bounded queue in front of one export task.
#[derive(Debug)]
pub struct BoundedBatch {
    spans: mpsc::Sender<SpanData>,
    flush: mpsc::Sender<oneshot::Sender<()>>,
    dropped: DroppedSpans,
}

impl BoundedBatch {
    /// Starts the export task on the current Tokio runtime.
    pub fn start<E: SpanExporter + 'static>(exporter: E, dropped: DroppedSpans) -> Self {
        let (spans, rx) = mpsc::channel(QUEUE_CAPACITY);
        let (flush, flush_rx) = mpsc::channel(1);
        tokio::spawn(run(exporter, rx, flush_rx, dropped.clone()));
        BoundedBatch {
            spans,
            flush,
            dropped,
        }
    }

    /// A handle that asks the task to send what is queued now and waits for it (bounded).
    pub fn flusher(&self) -> Flusher {
        Flusher(self.flush.clone())
    }
}

/// Sends the queued spans at once (shutdown, tests).
#[derive(Clone, Debug)]
pub struct Flusher(mpsc::Sender<oneshot::Sender<()>>);

impl Flusher {
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.0.send(done).await.is_ok() {
            let _ = tokio::time::timeout(EXPORT_TIMEOUT, wait).await;
        }
    }
}

impl SpanProcessor for BoundedBatch {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            count(&self.dropped, "queue_full", 1);
        }
    }

    /// Synchronous callers cannot wait for the async exporter; [`Flusher`] is the way to
    /// flush and wait.
    fn force_flush(&self) -> OTelSdkResult {
        match self.flush.try_send(oneshot::channel().0) {
            Ok(()) => Ok(()),
            Err(_) => Err(OTelSdkError::InternalFailure(
                "a flush is already pending".into(),
            )),
        }
    }

    /// The task ends when the provider (and so this sender) is dropped.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut flush: mpsc::Receiver<oneshot::Sender<()>>,
    dropped: DroppedSpans,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        // Wait for the first span of a batch (or a flush), then for more until the batch is
        // full or its delay is over.
        let mut flushed = None;
        tokio::select! {
            s = spans.recv() => match s {
                Some(s) => batch.push(s),
                None => return,
            },
            f = flush.recv() => flushed = f,
        }
        let deadline = tokio::time::Instant::now().later(BATCH_DELAY);
        while batch.len() < MAX_BATCH && flushed.is_none() {
            tokio::select! {
                s = spans.recv() => match s {
                    Some(s) => batch.push(s),
                    None => break,
                },
                f = flush.recv() => flushed = f,
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        if flushed.is_some() {
            while batch.len() < MAX_BATCH {
                match spans.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
        }
        if !batch.is_empty() {
            let n = batch.len();
            let sent = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
            match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(sent)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, spans = n, "exporting spans failed");
                    count(&dropped, "export_failed", n);
                }
                Err(_) => {
                    tracing::debug!(spans = n, "exporting spans timed out");
                    count(&dropped, "export_failed", n);
                }
            }
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}
