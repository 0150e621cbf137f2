//! What audit takes from a request as it arrives: its source IPs and user agent as
//! Kubernetes records them, and the annotations handlers add to its event.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;

/// The header that carries a request's audit ID both ways.
pub const AUDIT_ID_HEADER: &str = "audit-id";
/// Annotations set by the pipeline on every audited request.
pub const DECISION_ANNOTATION: &str = "authorization.svc.io/decision";
pub const REASON_ANNOTATION: &str = "authorization.svc.io/reason";
/// Set when `--max-requests-inflight` or `--max-mutating-requests-inflight` refused a request.
pub const RATE_LIMIT_ANNOTATION: &str = "apiserver.svc.io/rejected-by";

/// Kubernetes cuts user agents at 1024 bytes.
pub(super) const MAX_USER_AGENT: usize = 1024;
/// Annotations kept per request; more are refused (logged), so a plugin cannot grow an event
/// without bound.
pub(super) const MAX_ANNOTATIONS: usize = 64;
/// Annotations of one request, shared with handlers through the request's extensions.
#[derive(Clone, Debug, Default)]
pub struct Annotations(Arc<parking_lot::Mutex<BTreeMap<String, String>>>);

impl Annotations {
    /// Adds `key`; the first value set for a key stays (as Kubernetes keeps it).
    pub fn add(&self, key: &str, value: &str) {
        let mut map = self.0.lock();
        if let Some(old) = map.get(key) {
            if old != value {
                tracing::warn!(key, old, new = value, "audit annotation already set");
            }
            return;
        }
        if map.len() >= MAX_ANNOTATIONS {
            tracing::warn!(key, "too many audit annotations on one request");
            return;
        }
        map.insert(key.to_string(), value.to_string());
    }

    pub(super) fn snapshot(&self) -> BTreeMap<String, String> {
        self.0.lock().clone()
    }
}

/// Annotates the audit event of the request whose extensions these are (nothing when it is
/// not audited).
pub fn annotate(extensions: &http::Extensions, key: &str, value: &str) {
    if let Some(a) = extensions.get::<Annotations>() {
        a.add(key, value);
    }
}

/// Kubernetes' `SourceIPs`: the `X-Forwarded-For` chain, `X-Real-Ip` if not in it, then the
/// peer unless it is already last. The headers are client-supplied and untrusted.
pub(super) fn source_ips(headers: &HeaderMap, peer: Option<IpAddr>) -> Vec<String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    if let Some(xff) = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        ips.extend(
            xff.split(',')
                .filter_map(|p| p.trim().parse::<IpAddr>().ok()),
        );
    }
    if let Some(ip) = headers
        .get("x-real-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<IpAddr>().ok())
        && !ips.contains(&ip)
    {
        ips.push(ip);
    }
    if let Some(peer) = peer
        && ips.last() != Some(&peer)
    {
        ips.push(peer);
    }
    // The chain is bounded by the header size limit; keep events small anyway.
    ips.truncate(64);
    ips.iter().map(IpAddr::to_string).collect()
}

pub(super) fn user_agent(headers: &HeaderMap) -> String {
    let ua = headers
        .get(http::header::USER_AGENT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if ua.len() <= MAX_USER_AGENT {
        return ua;
    }
    let mut cut = MAX_USER_AGENT;
    while !ua.is_char_boundary(cut) {
        cut = cut.saturating_sub(1);
    }
    format!("{}...TRUNCATED", &ua[..cut])
}
