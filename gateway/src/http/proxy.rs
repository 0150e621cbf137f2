//! The pass-through of proxy mode (`--upstream-kubeconfig`): a request goes to the upstream
//! API server as it came (method, path, query, headers, the body streamed) under the proxy's
//! own credential, with `Impersonate-*` headers naming the caller, and the answer comes back
//! as it is (status, headers, the body streamed: watches and chunked lists alike).
//!
//! What is not passed on: the caller's `Authorization` (the proxy's credential replaces it),
//! the caller's own `Impersonate-*` and `X-Remote-*` headers (a caller's impersonation is
//! honoured only once the upstream allowed it, `security/impersonation.rs`, and then as the
//! proxy's headers), `Host`, and the hop-by-hop fields of RFC 9110 §7.6.1 (`Connection` and
//! every field it names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Transfer-Encoding`,
//! `Upgrade`, `Proxy-Authorization`, `Proxy-Authenticate`), both ways, except that a request
//! asking to switch protocols (`Connection: Upgrade`, as kubectl's exec, attach and
//! port-forward ask for SPDY or WebSocket over HTTP/1.1) keeps its `Upgrade` and goes on an
//! HTTP/1.1 connection of its own; when the upstream answers 101, the two connections are
//! joined byte for byte until either side closes.
//!
//! An upstream that cannot be reached is a `Status` naming it (a 429 with `Retry-After` when
//! no connection could be made, a 503 otherwise); one that sends no answer
//! head within `--request-timeout` is a 504, except for long-running requests (watches,
//! logs, exec, attach, port-forward, proxy), which have no time limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, header};
use http_body_util::BodyExt as _;
use svc_config::subject_access_review::NonResourceAttributes;
use svc_core::ApiError;
use svc_core::user::UserInfo;

use crate::http::respond::{self, Body};
use crate::outbound::client::{ClientError, RequestBody};

pub mod bounds;

use crate::outbound::upstream::Upstream;
use crate::security::access_review::AccessReviewer;
use crate::security::impersonation;
use crate::security::token_review::TokenReviewer;
use bounds::{Bound, LONG_RUNNING, Place, SHORT};

/// What proxy mode serves with: the upstream, and the two things that ask it about callers
/// (who they are, what they may do).
pub struct Proxy {
    pub upstream: Upstream,
    pub tokens: TokenReviewer,
    pub reviews: AccessReviewer,
    /// The caches lists and watches are served from (`http/cached.rs`).
    pub caches: Option<std::sync::Arc<crate::registry::caches::upstream::UpstreamCaches>>,
    /// `--upstream-caller-tokens`: a caller's bearer token is its credential upstream.
    pub caller_tokens: bool,
    /// The headers a front proxy names its caller in.
    pub request_headers: crate::security::authn::RequestHeaderNames,
    /// The bounds on long-running and on short requests passed upstream.
    pub long_running: Arc<Bound>,
    pub short: Arc<Bound>,
}

/// A request's place under the bounds of what is passed upstream, and whether it goes over
/// an upstream connection of its own (long-running, or asking to switch protocols).
pub struct Passage {
    place: Place,
    alone: bool,
}

impl Proxy {
    pub fn new(upstream: Upstream) -> Self {
        Proxy {
            tokens: TokenReviewer::new(upstream.clone()),
            reviews: AccessReviewer::new(upstream.clone()),
            upstream,
            caches: None,
            caller_tokens: false,
            request_headers: Default::default(),
            long_running: Bound::new(&LONG_RUNNING, 100, 10_000),
            short: Bound::new(&SHORT, 500, 4_000),
        }
    }

    /// Whether the upstream lets `caller` GET `path` of the proxy's own (`/metrics`): the
    /// upstream's 403 words when not.
    pub async fn may_read(&self, caller: &UserInfo, path: &str) -> Result<(), ApiError> {
        let attrs = NonResourceAttributes {
            path: path.to_string(),
            verb: "get".into(),
        };
        let (allowed, reason) = self.reviews.review(caller, None, Some(attrs)).await?;
        if allowed {
            return Ok(());
        }
        let mut message = format!(
            "forbidden: User \"{}\" cannot get path \"{path}\"",
            caller.username
        );
        if !reason.is_empty() {
            message.push_str(": ");
            message.push_str(&reason);
        }
        Err(ApiError::forbidden(message))
    }

    /// Passes `req` upstream as `caller` (or as whom the caller impersonates, once allowed)
    /// and returns the upstream's answer; `head_timeout` bounds the wait for its head. With
    /// `token` (the caller authenticated with it, and `--upstream-caller-tokens` is set) the
    /// request carries the caller's token instead, and its own `Impersonate-*` headers are
    /// the upstream's to judge. `passage` ([`Proxy::admit_upstream`]) is held until the
    /// answer's stream, or the joined connections, end; a long-running request, or one that
    /// asks to switch protocols, goes over an upstream connection of its own.
    pub async fn forward(
        &self,
        req: Request<RequestBody>,
        caller: &UserInfo,
        peer: Option<SocketAddr>,
        head_timeout: Option<Duration>,
        token: Option<HeaderValue>,
        passage: Passage,
    ) -> Response<Body> {
        match self
            .try_forward(req, caller, peer, head_timeout, token, passage)
            .await
        {
            Ok(resp) => resp,
            Err(e) => respond::error(&e),
        }
    }

    /// A place for a request to go upstream, counted against `caller`'s limit and the total
    /// of its kind: long-running (or asking to switch protocols, then over an upstream
    /// connection of its own) or short; 429 past either limit.
    pub fn admit_upstream(
        &self,
        uri: &http::Uri,
        headers: &HeaderMap,
        caller: &UserInfo,
    ) -> Result<Passage, ApiError> {
        let alone = long_running(uri) || upgrade_asked(headers).is_some();
        let bound = if alone {
            &self.long_running
        } else {
            &self.short
        };
        let place = bound.admit(&caller.username)?;
        Ok(Passage { place, alone })
    }

    async fn try_forward(
        &self,
        mut req: Request<RequestBody>,
        caller: &UserInfo,
        peer: Option<SocketAddr>,
        head_timeout: Option<Duration>,
        token: Option<HeaderValue>,
        passage: Passage,
    ) -> Result<Response<Body>, ApiError> {
        let Passage { place, alone } = passage;
        // The caller's own impersonation, as the upstream would see it with the caller's
        // token: passed on as asked.
        let own_impersonation: Vec<(HeaderName, HeaderValue)> = match token {
            Some(_) => req
                .headers()
                .iter()
                .filter(|(n, _)| impersonation::is_impersonation_header(n))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            None => Vec::new(),
        };
        let acting = match (&token, impersonation::requested(req.headers())?) {
            (Some(_), _) | (None, None) => None,
            (None, Some(wanted)) => {
                Some(impersonation::impersonate(&self.reviews, caller, wanted).await?)
            }
        };
        let acting = acting.as_ref().unwrap_or(caller);
        let upgrade = upgrade_asked(req.headers());
        let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let mut headers = request_headers(&parts.headers, peer);
        if token.is_some() {
            for (n, v) in own_impersonation {
                headers.append(n, v);
            }
        } else {
            impersonation::headers_for(acting, &mut headers)?;
        }
        if let Some(protocol) = &upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            headers.insert(header::UPGRADE, protocol.clone());
        }
        parts.headers = headers;
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        parts.uri = path
            .parse()
            .map_err(|e| ApiError::bad_request(format!("request path: {e}")))?;
        let upstream_req = Request::from_parts(parts, body);
        // Long-running requests and upgrades never share the connection of short requests
        // and the proxy's own calls: each takes an HTTP/1.1 connection of its own.
        let sent = async {
            match (token, alone) {
                (Some(t), alone) => self.upstream.send_as(upstream_req, t, alone).await,
                (None, true) => self.upstream.send_alone(upstream_req).await,
                (None, false) => self.upstream.send(upstream_req).await,
            }
        };
        let answer = match head_timeout {
            None => sent.await,
            Some(t) => match tokio::time::timeout(t, sent).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(ApiError::Timeout {
                        message: format!(
                            "the upstream API server {} sent no answer within {t:?}",
                            self.upstream.url()
                        ),
                        retry_after_seconds: None,
                    });
                }
            },
        };
        let mut resp = answer.map_err(|e| upstream_unreachable(&self.upstream, &e))?;
        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_upgrade) = client_upgrade
        {
            return Ok(join_upgraded(client_upgrade, &mut resp, place));
        }
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let body = body.map_err(std::io::Error::other).boxed();
        Ok(Response::from_parts(parts, respond::holding(body, place)))
    }
}

/// The protocol a request asks to switch to: its `Upgrade`, when `Connection` names
/// `upgrade`.
pub fn upgrade_asked(headers: &HeaderMap) -> Option<HeaderValue> {
    let asked = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asked
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// The upstream's 101 passed back, and a task that joins the caller's connection to the
/// upstream's once both have switched, copying both ways until either side closes.
fn join_upgraded(
    client: hyper::upgrade::OnUpgrade,
    upstream: &mut Response<hyper::body::Incoming>,
    place: Place,
) -> Response<Body> {
    let upstream_upgrade = hyper::upgrade::on(&mut *upstream);
    let mut out = Response::new(respond::full(bytes::Bytes::new()));
    *out.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let mut headers = upstream.headers().clone();
    let protocol = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut headers);
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Some(p) = protocol {
        headers.insert(header::UPGRADE, p);
    }
    *out.headers_mut() = headers;
    tokio::spawn(async move {
        // The place is the joined connections' until they end.
        let _held = place;
        match (client.await, upstream_upgrade.await) {
            (Ok(c), Ok(u)) => {
                let mut c = hyper_util::rt::TokioIo::new(c);
                let mut u = hyper_util::rt::TokioIo::new(u);
                if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut u).await {
                    tracing::debug!(error = %e, "an upgraded connection ended");
                }
            }
            (c, u) => tracing::debug!(
                client = ?c.err(),
                upstream = ?u.err(),
                "a connection did not switch protocols"
            ),
        }
    });
    out
}

/// A request the upstream did not answer. One that never left (no connection could be made:
/// the upstream restarting, say) is a 429 with `Retry-After: 1`, as kube-apiserver answers
/// while it shuts down: clients retry it, and a client-go informer whose watch is refused so
/// resumes its watch where it was instead of listing everything again, as it does for
/// a connection refused by kube-apiserver itself. Any other failure is a 503.
fn upstream_unreachable(upstream: &Upstream, e: &ClientError) -> ApiError {
    tracing::warn!(upstream = %upstream.url(), error = %e, "upstream request failed");
    let message = format!(
        "the upstream API server {} could not be reached: {e}",
        upstream.url()
    );
    match e {
        ClientError::Connect { .. } => ApiError::TooManyRequests {
            message: format!("{message}; please try again later"),
            retry_after_seconds: Some(1),
        },
        _ => ApiError::ServiceUnavailable(message),
    }
}

/// Whether a request may run for as long as it likes, as kube-apiserver's long-running check
/// says: watches, and the `log`, `exec`, `attach`, `portforward` and `proxy` subresources.
pub fn long_running(uri: &http::Uri) -> bool {
    // What follows the group and version: [namespaces NS] RESOURCE [NAME [SUB ...]].
    let (watch, rest) = crate::base::router::watch_and_rest(uri);
    let rest = match rest.as_slice() {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        rest => rest,
    };
    let subresource = matches!(
        rest.get(2).copied(),
        Some("log" | "exec" | "attach" | "portforward" | "proxy")
    );
    watch || subresource
}

/// Fields that belong to one connection (RFC 9110 §7.6.1), never passed on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "trailer",
];

/// Removes the hop-by-hop fields, those `Connection` names included.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(*n);
    }
}

/// The caller's headers as the upstream gets them: no hop-by-hop fields, no credential, no
/// identity headers, no `Host` (the client sets the upstream's), no `Expect` (the body is
/// already being read), and the caller's address added to `X-Forwarded-For`.
fn request_headers(incoming: &HeaderMap, peer: Option<SocketAddr>) -> HeaderMap {
    let mut headers = incoming.clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
    headers.remove(header::EXPECT);
    let identity: Vec<HeaderName> = headers
        .keys()
        .filter(|n| impersonation::is_identity_header(n))
        .cloned()
        .collect();
    for n in identity {
        headers.remove(n);
    }
    if let Some(peer) = peer {
        let ip = peer.ip().to_string();
        let value = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(before) if !before.trim().is_empty() => format!("{before}, {ip}"),
            _ => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert("x-forwarded-for", v);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn credentials_identity_and_hop_by_hop_fields_stay_behind() {
        let incoming = h(&[
            ("authorization", "Bearer secret"),
            ("impersonate-user", "admin"),
            ("impersonate-group", "system:masters"),
            ("impersonate-extra-scopes", "x"),
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("host", "proxy:6443"),
            ("accept", "application/json"),
            ("content-type", "application/json"),
            ("user-agent", "kubectl"),
            ("x-forwarded-for", "10.0.0.9"),
        ]);
        let out = request_headers(&incoming, Some("127.0.0.2:5000".parse().unwrap()));
        let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["accept", "content-type", "user-agent", "x-forwarded-for"]
        );
        assert_eq!(out["x-forwarded-for"], "10.0.0.9, 127.0.0.2");
    }

    #[test]
    fn the_answer_loses_its_hop_by_hop_fields_only() {
        let mut resp = h(&[
            ("connection", "close"),
            ("transfer-encoding", "chunked"),
            ("content-type", "application/json"),
            ("audit-id", "x"),
            ("cache-control", "no-cache, private"),
        ]);
        strip_hop_by_hop(&mut resp);
        let mut names: Vec<&str> = resp.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["audit-id", "cache-control", "content-type"]);
    }

    #[test]
    fn watches_and_streams_are_long_running() {
        let yes = [
            "/api/v1/pods?watch=true",
            "/api/v1/namespaces/a/configmaps?watch=1&resourceVersion=5",
            "/api/v1/watch/pods",
            "/apis/apps/v1/watch/namespaces/a/deployments",
            "/api/v1/namespaces/a/pods/p/log?follow=true",
            "/api/v1/namespaces/a/pods/p/exec?command=ls",
            "/api/v1/namespaces/a/services/s/proxy/x",
        ];
        for p in yes {
            assert!(long_running(&p.parse().unwrap()), "{p}");
        }
        let no = [
            "/api/v1/pods",
            "/api/v1/pods?watch=false",
            "/apis/example.com/v1/watchers",
            "/api/v1/namespaces/watch/configmaps",
            "/api/v1/namespaces/log/configmaps/exec",
            "/api/v1/namespaces/a/pods/log",
        ];
        for p in no {
            assert!(!long_running(&p.parse().unwrap()), "{p}");
        }
    }
}
