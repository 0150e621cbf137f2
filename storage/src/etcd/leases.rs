//! Leases for keys with a time to live, shared the way Kubernetes' lease manager shares them
//! (`apiserver/pkg/storage/etcd3/lease_manager.go`): a write asking for `ttl` reuses the lease
//! last granted for that `ttl` while the lease outlives `ttl` from now but by less than the
//! reuse window (5% of `ttl`, at most a minute), so with `--event-ttl=1h` all events written
//! within one minute share one lease. A lease is granted with `ttl` plus that window; a key
//! therefore never expires early and at most a window late. A lease also carries at most
//! `MAX_ATTACHED` writes, so revoking one never deletes an unbounded number of keys at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::pb::etcdserverpb::LeaseGrantRequest;
use super::{EtcdState, Retry};
use crate::{Later, StoreError};

/// Share of the TTL by which a lease may outlive what a write asked for.
const REUSE_PERCENT: u64 = 5;
/// Upper bound of that window, in seconds (Kubernetes' `leaseReuseDurationSeconds`).
const REUSE_MAX_SECONDS: i64 = 60;
/// Writes attached to one lease before a new one is granted (Kubernetes' default).
const MAX_ATTACHED: u64 = 1000;

/// The lease last granted for one TTL.
#[derive(Clone, Copy, Debug)]
struct Granted {
    id: i64,
    /// When etcd lets it expire, as seen from here (counted from before the grant, so never
    /// later than etcd's own clock says).
    expires: Instant,
    attached: u64,
}

/// The leases of one store, by TTL in whole seconds.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    // Held across the grant call, as Kubernetes holds its lock: concurrent writers asking for
    // the same TTL wait for one grant instead of each granting their own.
    granted: Mutex<HashMap<i64, Granted>>,
}

/// etcd's TTL for `ttl`: whole seconds, rounded up, at least 1.
fn seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_nanos().div_ceil(1_000_000_000);
    i64::try_from(secs).unwrap_or(i64::MAX).max(1)
}

/// How much longer than `secs` a lease may live and still be reused.
fn reuse_window(secs: i64) -> i64 {
    let percent = i64::try_from(REUSE_PERCENT).unwrap_or(0);
    (secs.saturating_mul(percent) / 100).min(REUSE_MAX_SECONDS)
}

impl Granted {
    /// Whether a write at `now` asking for `secs` may join this lease.
    fn reusable(&self, now: Instant, secs: i64) -> bool {
        let at_least = now.later(Duration::from_secs(secs.unsigned_abs()));
        let at_most = at_least.later(Duration::from_secs(reuse_window(secs).unsigned_abs()));
        self.expires > at_least && self.expires < at_most && self.attached < MAX_ATTACHED
    }
}

impl Leases {
    /// A lease that expires between `ttl` and `ttl` plus the reuse window from now.
    pub(crate) async fn lease_for(
        &self,
        shared: &EtcdState,
        ttl: Duration,
    ) -> Result<i64, StoreError> {
        let secs = seconds(ttl);
        let mut granted = self.granted.lock().await;
        let now = Instant::now();
        if let Some(lease) = granted.get_mut(&secs)
            && lease.reusable(now, secs)
        {
            lease.attached = lease.attached.saturating_add(1);
            return Ok(lease.id);
        }
        let request = LeaseGrantRequest {
            ttl: secs.saturating_add(reuse_window(secs)),
            id: 0,
        };
        // A grant sent twice leaves an unused lease that expires by itself: safe to retry.
        let grant = |c: super::client::Client| async move { c.lease_grant(request).await };
        let response = shared.call(Retry::Always, grant).await?;
        if !response.error.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "etcd refused a lease: {}",
                response.error
            )));
        }
        // etcd may grant more than asked (its minimum TTL): count what it granted.
        let lives = Duration::from_secs(response.ttl.max(request.ttl).unsigned_abs());
        granted.retain(|_, lease| lease.expires > now);
        granted.insert(
            secs,
            Granted {
                id: response.id,
                expires: now.later(lives),
                attached: 1,
            },
        );
        Ok(response.id)
    }

    /// Drops `id` from the cache (etcd no longer knows it), so the next write gets a new one.
    pub(crate) async fn forget(&self, ttl: Duration, id: i64) {
        let mut granted = self.granted.lock().await;
        if granted
            .get(&seconds(ttl))
            .is_some_and(|lease| lease.id == id)
        {
            granted.remove(&seconds(ttl));
        }
    }
}

/// Whether a write failed because its lease is gone (expired or revoked since it was cached).
pub(crate) fn lease_not_found(err: &StoreError) -> bool {
    matches!(err, StoreError::Backend(source) if source.to_string().contains("lease not found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_secs(2)), 2);
        assert_eq!(seconds(Duration::from_millis(2001)), 3);
        assert_eq!(seconds(Duration::ZERO), 1);
    }

    #[test]
    fn an_hour_shares_leases_for_a_minute() {
        assert_eq!(reuse_window(3600), 60);
        assert_eq!(reuse_window(600), 30);
        // Short TTLs get no window: one lease per write, never late.
        assert_eq!(reuse_window(2), 0);
        let now = Instant::now();
        let lease = Granted {
            id: 7,
            expires: now + Duration::from_secs(3600 + 59),
            attached: 1,
        };
        assert!(lease.reusable(now, 3600));
        // Asked for later than the lease lives: a new lease.
        assert!(!lease.reusable(now + Duration::from_secs(61), 3600));
        // Full: a new lease.
        let full = Granted {
            attached: MAX_ATTACHED,
            ..lease
        };
        assert!(!full.reusable(now, 3600));
    }
}
