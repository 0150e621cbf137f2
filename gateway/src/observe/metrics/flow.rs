//! The flow-control metrics of the in-flight limits (`http::limits`), with Kubernetes' API
//! Priority and Fairness names: `apiserver_flowcontrol_current_inqueue_requests`,
//! `apiserver_flowcontrol_current_executing_requests`,
//! `apiserver_flowcontrol_rejected_requests_total` and
//! `apiserver_flowcontrol_request_wait_duration_seconds`, labelled by `priority_level`
//! (`readOnly`, `mutating`; `watch` for rejected watches), and why a request was turned away.

use std::time::Instant;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Kubernetes' buckets for `apiserver_flowcontrol_request_wait_duration_seconds`.
const WAIT_BUCKETS: [f64; 13] = [
    0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0,
];

/// Why a request was turned away, as Kubernetes' `reason` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The user's queue, or the number of queued users, was at its bound.
    QueueFull,
    /// The request waited `--max-queue-wait` without getting a seat.
    TimeOut,
    /// No seat and no queueing (a watch past `--max-watches`, or queues of length 0).
    ConcurrencyLimit,
}

impl Rejection {
    pub fn reason(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue-full",
            Rejection::TimeOut => "time-out",
            Rejection::ConcurrencyLimit => "concurrency-limit",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    priority_level: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    priority_level: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitLabels {
    priority_level: &'static str,
    /// `true` when the request went on to run, `false` when it was rejected.
    execute: &'static str,
}

/// The flow-control metric families, shared by every pool; registered by `Api::new`.
#[derive(Clone)]
pub struct FlowMetrics {
    inqueue: Family<LevelLabels, Gauge>,
    executing: Family<LevelLabels, Gauge>,
    rejected: Family<RejectedLabels, Counter>,
    wait: Family<WaitLabels, Histogram>,
}

impl Default for FlowMetrics {
    fn default() -> Self {
        let m = FlowMetrics {
            inqueue: Family::default(),
            executing: Family::default(),
            rejected: Family::default(),
            wait: Family::new_with_constructor(|| Histogram::new(WAIT_BUCKETS)),
        };
        for level in ["readOnly", "mutating"] {
            let l = LevelLabels {
                priority_level: level,
            };
            let _ = m.inqueue.get_or_create(&l);
            let _ = m.executing.get_or_create(&l);
        }
        m
    }
}

impl FlowMetrics {
    /// The in-queue and executing gauges of a priority level (`readOnly`, `mutating`).
    pub fn level_gauges(&self, level: &'static str) -> (Gauge, Gauge) {
        let labels = LevelLabels {
            priority_level: level,
        };
        (
            self.inqueue.get_or_create_owned(&labels),
            self.executing.get_or_create_owned(&labels),
        )
    }

    /// `(name, help, metric)` of every family, for the registry.
    pub fn families(&self) -> Vec<(&'static str, &'static str, FlowFamily)> {
        vec![
            (
                "apiserver_flowcontrol_current_inqueue_requests",
                "Number of requests currently pending in queues of the API Priority and \
                 Fairness subsystem",
                FlowFamily(AnyFamily::Level(self.inqueue.clone())),
            ),
            (
                "apiserver_flowcontrol_current_executing_requests",
                "Number of requests in initial (for a WATCH) or any (for a non-WATCH) \
                 execution stage in the API Priority and Fairness subsystem",
                FlowFamily(AnyFamily::Level(self.executing.clone())),
            ),
            (
                "apiserver_flowcontrol_rejected_requests",
                "Number of requests rejected by API Priority and Fairness subsystem",
                FlowFamily(AnyFamily::Rejected(self.rejected.clone())),
            ),
            (
                "apiserver_flowcontrol_request_wait_duration_seconds",
                "Length of time a request spent waiting in its queue",
                FlowFamily(AnyFamily::Wait(self.wait.clone())),
            ),
        ]
    }

    /// Counts a rejection of a request of `level`.
    pub fn rejected(&self, level: &'static str, why: Rejection) {
        self.rejected
            .get_or_create(&RejectedLabels {
                priority_level: level,
                reason: why.reason(),
            })
            .inc();
    }

    pub fn waited(&self, level: &'static str, executed: bool, since: Instant) {
        self.wait
            .get_or_create(&WaitLabels {
                priority_level: level,
                execute: if executed { "true" } else { "false" },
            })
            .observe(since.elapsed().as_secs_f64());
    }
}

/// One of the flow-control families, as the registry takes it.
#[derive(Debug)]
pub struct FlowFamily(AnyFamily);

#[derive(Debug)]
enum AnyFamily {
    Level(Family<LevelLabels, Gauge>),
    Rejected(Family<RejectedLabels, Counter>),
    Wait(Family<WaitLabels, Histogram>),
}

impl EncodeMetric for FlowFamily {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        match &self.0 {
            AnyFamily::Level(f) => f.encode(encoder),
            AnyFamily::Rejected(f) => f.encode(encoder),
            AnyFamily::Wait(f) => f.encode(encoder),
        }
    }

    fn metric_type(&self) -> MetricType {
        match &self.0 {
            AnyFamily::Level(f) => f.metric_type(),
            AnyFamily::Rejected(f) => f.metric_type(),
            AnyFamily::Wait(f) => f.metric_type(),
        }
    }
}
