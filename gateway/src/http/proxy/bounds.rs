//! The bounds on requests passed upstream in proxy mode, one per user and one in all; past
//! either a request is answered 429 with `Retry-After`, as kube-apiserver's own limits
//! answer. Two are kept ([`LONG_RUNNING`], [`SHORT`]):
//!
//! - long-running requests (watches the caches do not answer, logs with follow, exec, attach,
//!   port-forward, proxy), each held from the upstream's answer until its stream ends. Each
//!   goes upstream over a connection of its own (`outbound/upstream.rs`), so with the bound
//!   a caller can hold neither the upstream connection that short requests, access reviews
//!   and TokenReviews share, nor an unbounded number of upstream connections;
//! - short requests (writes, and reads the caches do not answer), each held until the
//!   upstream's answer has been sent on. They take no seat of the proxy's own in-flight
//!   pools, which are for what the proxy serves itself: the upstream has its own limits and
//!   its priority levels (a kubelet's lease renewal before a controller's write), which a
//!   second queue in front of it would undo, turning its slowness into the proxy's 429s.
//!   This bound is there for the proxy's memory and the upstream connection's streams, not
//!   to share out the upstream.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use svc_core::ApiError;

/// What a bound is called: in its 429s, its flags and its metrics.
#[derive(Debug)]
pub struct Names {
    /// "long-running requests".
    what: &'static str,
    per_user_flag: &'static str,
    max_flag: &'static str,
    /// The metrics' prefix.
    metric: &'static str,
}

/// Long-running requests passed upstream.
pub const LONG_RUNNING: Names = Names {
    what: "long-running requests",
    per_user_flag: "--upstream-long-running-per-user",
    max_flag: "--upstream-long-running-max",
    metric: "svc_proxy_upstream_long_running",
};

/// Short requests passed upstream.
pub const SHORT: Names = Names {
    what: "short requests",
    per_user_flag: "--upstream-requests-per-user",
    max_flag: "--upstream-requests-max",
    metric: "svc_proxy_upstream_short",
};

/// The counts and their limits. Cheap to share.
#[derive(Debug)]
pub struct Bound {
    names: &'static Names,
    per_user: usize,
    max: usize,
    held: Mutex<Held>,
    refused_user: AtomicU64,
    refused_max: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    by_user: HashMap<String, usize>,
    total: usize,
}

/// One request's place; given back when dropped.
#[derive(Debug)]
pub struct Place {
    owner: Arc<Bound>,
    user: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.owner.held.lock();
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_user.remove(&self.user);
            }
        }
    }
}

impl Bound {
    pub fn new(names: &'static Names, per_user: usize, max: usize) -> Arc<Self> {
        Arc::new(Bound {
            names,
            per_user,
            max,
            held: Mutex::new(Held::default()),
            refused_user: AtomicU64::new(0),
            refused_max: AtomicU64::new(0),
        })
    }

    /// A place for one more of `user`'s requests, or 429 naming the limit.
    pub fn admit(self: &Arc<Self>, user: &str) -> Result<Place, ApiError> {
        let Names {
            what,
            per_user_flag,
            max_flag,
            ..
        } = self.names;
        let mut held = self.held.lock();
        let mine = held.by_user.get(user).copied().unwrap_or(0);
        let refused = if mine >= self.per_user {
            self.refused_user.fetch_add(1, Ordering::Relaxed);
            Some(format!(
                "User {user:?} has {mine} {what} passed to the upstream API server, the most \
                 one user may have ({per_user_flag})"
            ))
        } else if held.total >= self.max {
            self.refused_max.fetch_add(1, Ordering::Relaxed);
            Some(format!(
                "{} {what} are passed to the upstream API server, the most there may be \
                 ({max_flag})",
                held.total
            ))
        } else {
            None
        };
        if let Some(why) = refused {
            drop(held);
            tracing::info!(user, reason = %why, "request refused");
            return Err(ApiError::too_many_requests(&why));
        }
        held.total = held.total.saturating_add(1);
        let mine = held.by_user.entry(user.to_string()).or_insert(0);
        *mine = mine.saturating_add(1);
        Ok(Place {
            owner: Arc::clone(self),
            user: user.to_string(),
        })
    }

    /// How many are held: (all users, `user`'s).
    pub fn held(&self, user: &str) -> (usize, usize) {
        let held = self.held.lock();
        (held.total, held.by_user.get(user).copied().unwrap_or(0))
    }
}

/// A bound's metrics, read at each scrape: `<metric>_requests` and `<metric>_users` now,
/// `<metric>_limit` by scope, `<metric>_refused_total` by the limit reached.
#[derive(Debug)]
struct BoundCollector(Arc<Bound>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: &'static str,
}

impl Collector for BoundCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let b = &self.0;
        let (total, users) = {
            let held = b.held.lock();
            (held.total, held.by_user.len())
        };
        let Names { what, metric, .. } = b.names;
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let gauges = [
            (
                "requests",
                format!("The {what} passed to the upstream now."),
                total,
            ),
            (
                "users",
                format!("Users with at least one of the {what} passed to the upstream now."),
                users,
            ),
        ];
        for (suffix, help, value) in gauges {
            let name = format!("{metric}_{suffix}");
            let family = encoder.encode_descriptor(&name, &help, None, MetricType::Gauge)?;
            ConstGauge::new(count(value)).encode(family)?;
        }
        let name = format!("{metric}_limit");
        let help = format!("The most {what} passed to the upstream, per user and in all.");
        let mut family = encoder.encode_descriptor(&name, &help, None, MetricType::Gauge)?;
        for (scope, value) in [("user", b.per_user), ("total", b.max)] {
            ConstGauge::new(count(value)).encode(family.encode_family(&ScopeLabels { scope })?)?;
        }
        let name = format!("{metric}_refused");
        let help =
            format!("The {what} for the upstream answered 429 at a limit, by the limit reached.");
        let mut family = encoder.encode_descriptor(&name, &help, None, MetricType::Counter)?;
        for (scope, value) in [("user", &b.refused_user), ("total", &b.refused_max)] {
            ConstCounter::new(value.load(Ordering::Relaxed))
                .encode(family.encode_family(&ScopeLabels { scope })?)?;
        }
        Ok(())
    }
}

impl Bound {
    /// The bound's metrics, for the server's registry.
    pub fn collector(self: &Arc<Self>) -> Box<dyn Collector> {
        Box::new(BoundCollector(Arc::clone(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound's metrics as a registry holding only them encodes them.
    fn scrape(b: &Arc<Bound>) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(b.collector());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn places_are_bounded_per_user_and_in_all_and_come_back() {
        let limits = Bound::new(&LONG_RUNNING, 2, 3);
        let a1 = limits.admit("a").unwrap();
        let _a2 = limits.admit("a").unwrap();
        let e = limits.admit("a").unwrap_err();
        assert_eq!(e.code(), 429);
        assert!(e.to_string().contains("--upstream-long-running-per-user"));
        let _b1 = limits.admit("b").unwrap();
        let e = limits.admit("c").unwrap_err();
        assert!(e.to_string().contains("--upstream-long-running-max"));
        assert_eq!(limits.held("a"), (3, 2));
        drop(a1);
        assert_eq!(limits.held("a"), (2, 1));
        let _c1 = limits.admit("c").unwrap();
        let text = scrape(&limits);
        assert!(text.contains("svc_proxy_upstream_long_running_requests 3\n"));
        assert!(text.contains("svc_proxy_upstream_long_running_refused_total{scope=\"user\"} 1\n"));
        assert!(
            text.contains("svc_proxy_upstream_long_running_refused_total{scope=\"total\"} 1\n")
        );
    }

    #[test]
    fn the_short_bound_names_its_own_flags_and_metrics() {
        let limits = Bound::new(&SHORT, 1, 5);
        let _a = limits.admit("a").unwrap();
        let e = limits.admit("a").unwrap_err();
        assert_eq!(e.code(), 429);
        assert!(e.to_string().contains("1 short requests"), "{e}");
        assert!(
            e.to_string().contains("--upstream-requests-per-user"),
            "{e}"
        );
        let text = scrape(&limits);
        assert!(
            text.contains("svc_proxy_upstream_short_requests 1\n"),
            "{text}"
        );
        assert!(
            text.contains("svc_proxy_upstream_short_limit{scope=\"total\"} 5\n"),
            "{text}"
        );
        assert!(!text.contains("long_running"), "{text}");
    }
}
