//! What audit takes from a request as it arrives: its source IPs and user agent as
//! Kubernetes records them, and the annotations handlers add to its event.

use std::net::IpAddr;

use http::HeaderMap;

pub use crate::base::annotations::{
    Annotations, DECISION_ANNOTATION, MAX_ANNOTATIONS, RATE_LIMIT_ANNOTATION, REASON_ANNOTATION,
    annotate,
};

/// The header that carries a request's audit ID both ways.
pub const AUDIT_ID_HEADER: &str = "audit-id";
/// Kubernetes cuts user agents at 1024 bytes.
pub(super) const MAX_USER_AGENT: usize = 1024;

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
