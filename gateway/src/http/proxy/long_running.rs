//! The bound on long-running requests passed upstream in proxy mode (watches the caches do
//! not answer, logs with follow, exec, attach, port-forward, proxy): at most
//! `--upstream-long-running-per-user` for one user and `--upstream-long-running-max` in all,
//! each held from the upstream's answer until its stream ends; past either a request is
//! answered 429 with `Retry-After`, as kube-apiserver's own limits answer. Each such request
//! goes upstream over a connection of its own (`outbound/upstream.rs`), so with the bound a
//! caller can hold neither the upstream connection that short requests, access reviews and
//! TokenReviews share, nor an unbounded number of upstream connections.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use svc_core::ApiError;

/// The counts and their limits. Cheap to share.
#[derive(Debug)]
pub struct LongRunning {
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

/// One long-running request's place; given back when dropped.
#[derive(Debug)]
pub struct Place {
    owner: Arc<LongRunning>,
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

impl LongRunning {
    pub fn new(per_user: usize, max: usize) -> Arc<Self> {
        Arc::new(LongRunning {
            per_user,
            max,
            held: Mutex::new(Held::default()),
            refused_user: AtomicU64::new(0),
            refused_max: AtomicU64::new(0),
        })
    }

    /// A place for one more of `user`'s long-running requests, or 429 naming the limit.
    pub fn admit(self: &Arc<Self>, user: &str) -> Result<Place, ApiError> {
        let mut held = self.held.lock();
        let mine = held.by_user.get(user).copied().unwrap_or(0);
        let refused = if mine >= self.per_user {
            self.refused_user.fetch_add(1, Ordering::Relaxed);
            Some(format!(
                "User {user:?} has {mine} long-running requests passed to the upstream API \
                 server, the most one user may have (--upstream-long-running-per-user)"
            ))
        } else if held.total >= self.max {
            self.refused_max.fetch_add(1, Ordering::Relaxed);
            Some(format!(
                "{} long-running requests are passed to the upstream API server, the most \
                 there may be (--upstream-long-running-max)",
                held.total
            ))
        } else {
            None
        };
        if let Some(why) = refused {
            drop(held);
            tracing::info!(user, reason = %why, "long-running request refused");
            return Err(ApiError::TooManyRequests {
                message: format!("Too many requests, please try again later ({why})."),
                retry_after_seconds: Some(1),
            });
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

    /// The metrics in the OpenMetrics text format.
    pub fn encode_metrics(&self) -> String {
        let (total, users) = {
            let held = self.held.lock();
            (held.total, held.by_user.len())
        };
        let mut out = String::new();
        let gauges = [
            (
                "svc_proxy_upstream_long_running_requests",
                "Long-running requests passed to the upstream now, each on a connection of its own.",
                total,
            ),
            (
                "svc_proxy_upstream_long_running_users",
                "Users with at least one long-running request passed to the upstream now.",
                users,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        }
        let name = "svc_proxy_upstream_long_running_limit";
        let _ = writeln!(
            out,
            "# HELP {name} The most long-running requests passed to the upstream, per user and \
             in all."
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{scope=\"user\"}} {}", self.per_user);
        let _ = writeln!(out, "{name}{{scope=\"total\"}} {}", self.max);
        let name = "svc_proxy_upstream_long_running_refused";
        let _ = writeln!(
            out,
            "# HELP {name} Long-running requests answered 429 at a limit, by the limit reached."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(
            out,
            "{name}_total{{scope=\"user\"}} {}",
            self.refused_user.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "{name}_total{{scope=\"total\"}} {}",
            self.refused_max.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_per_user_and_in_all_and_come_back() {
        let limits = LongRunning::new(2, 3);
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
        let text = limits.encode_metrics();
        assert!(text.contains("svc_proxy_upstream_long_running_requests 3\n"));
        assert!(text.contains("svc_proxy_upstream_long_running_refused_total{scope=\"user\"} 1\n"));
        assert!(
            text.contains("svc_proxy_upstream_long_running_refused_total{scope=\"total\"} 1\n")
        );
    }
}
