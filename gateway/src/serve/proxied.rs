//! The pipeline of proxy mode (`--upstream-kubeconfig`): authenticate (client certificate of
//! `--client-ca-file`, or a token the upstream's TokenReview accepts), answer the proxy's own
//! `/healthz`, `/livez` and `/readyz` (to anyone; a single check such as `/readyz/upstream`,
//! and its own `/metrics`, to whom the upstream lets read that path), serve what the caches
//! answer under the in-flight limits, and pass everything else upstream under the bounds of
//! `http/proxy/bounds.rs` (`http/proxy.rs`). Authorization is the upstream's: it sees the
//! caller through impersonation. A watch passed through ends when the server ends its
//! watches at shutdown.

use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;

use crate::base::query::Query;
use crate::base::router::{self, Route};
use crate::base::verb::Verb;
use crate::http::cached;
use crate::http::health;
use crate::http::proxy::{self, Proxy};
use crate::http::respond::{self, Body};
use crate::observe::metrics;
use crate::security::authn;
use crate::serve::app::ServerState;
use crate::serve::held::{Held, Stop};
use crate::serve::request::{Caller, RequestBody};
use crate::serve::seats::{Admitted, admit};

/// Every request of a proxy, counted in the request metrics (by verb and code: the resource
/// labels stay empty, as the proxy does not read its callers' paths yet).
pub async fn handle(
    app: &Arc<ServerState>,
    proxy: &Proxy,
    caller: Caller,
    req: Request<RequestBody>,
) -> Response<Body> {
    let start = Instant::now();
    let long_running = proxy::long_running(req.uri());
    let verb = if long_running {
        Verb::Watch
    } else {
        Verb::of(req.method(), &Route::NotFound, false)
    };
    let query = Query::parse(req.uri().query());
    let info =
        metrics::RequestInfo::new(verb, req.method(), &Route::NotFound, &query, req.headers());
    let inflight = app.api.metrics.start(&info);
    let resp = serve(app, proxy, caller, req, verb, long_running, &query).await;
    drop(inflight);
    app.api
        .metrics
        .observe(&info, resp.status().as_u16(), start.elapsed());
    resp
}

async fn serve(
    app: &Arc<ServerState>,
    proxy: &Proxy,
    caller: Caller,
    req: Request<RequestBody>,
    verb: Verb,
    long_running: bool,
    query: &Query,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    // `--upstream-caller-tokens`: a caller authenticated by its bearer token (not by a
    // certificate) is its own credential upstream.
    let token = match &caller {
        Caller::Connection(ident) if proxy.caller_tokens && ident.cert_user.is_none() => req
            .headers()
            .get(http::header::AUTHORIZATION)
            .filter(|v| v.as_bytes().starts_with(b"Bearer "))
            .cloned(),
        _ => None,
    };
    let (user, peer) = match &caller {
        Caller::Connection(ident) => (
            authn::authenticate_proxied(
                &proxy.tokens,
                ident,
                &proxy.request_headers,
                req.method(),
                &path,
                req.headers(),
            )
            .await,
            ident.peer,
        ),
        Caller::Internal(user) => (Ok(user.clone()), None),
    };
    let user = match user {
        Ok(u) => u,
        Err(e) => return respond::error(&e),
    };
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    match router::route(&path) {
        Route::Health { endpoint, check } if read => {
            // The bare endpoints are everyone's (kube-apiserver's `system:public-info-viewer`
            // grants them); a single check is read by whom the upstream lets read its path.
            if check.is_some()
                && let Err(e) = proxy.may_read(&user, &path).await
            {
                return respond::error(&e);
            }
            return health::serve_proxied(
                &app.api,
                &proxy.upstream,
                proxy.caches.as_deref(),
                endpoint,
                check.as_deref(),
                query,
            )
            .await;
        }
        // The proxy's own metrics, to whom the upstream lets read `/metrics`.
        Route::Metrics if read => {
            return match proxy.may_read(&user, &path).await {
                Ok(()) => respond::bytes_response(
                    StatusCode::OK,
                    metrics::CONTENT_TYPE,
                    app.api.metrics.encode(),
                ),
                Err(e) => respond::error(&e),
            };
        }
        _ => {}
    }
    // What the proxy serves itself (a watch's place, and the seats of the read-only pool
    // for what its caches may answer) is admitted under its in-flight limits. What it passes
    // upstream takes no seat: the upstream has its own limits and priorities
    // (`http/proxy/bounds.rs`).
    let cached = proxy.caches.as_ref().filter(|_| read);
    let mut watch = None;
    let mut passed = cached::Passed::default();
    if verb == Verb::Watch || cached.is_some() {
        let Admitted { watch: slot, _seat } = match admit(app, &user, verb, 1).await {
            Ok(a) => a,
            Err(why) => {
                return respond::error(&svc_core::ApiError::too_many_requests(why.reason()));
            }
        };
        watch = slot;
        if let Some(caches) = cached
            && let Some(resp) = cached::serve(
                &app.api,
                proxy,
                caches,
                &user,
                &path,
                query,
                req.headers(),
                &mut passed,
            )
            .await
        {
            return match watch {
                // A cached watch holds its place until its stream ends.
                Some(place) => resp.map(|body| respond::holding(body, place)),
                None => resp,
            };
        }
    }
    // Passed through, within the caller's bound and the total (429 past either); a
    // long-running request or an upgrade takes an upstream connection of its own.
    // A watch from a version older than the cache, refused a place, is told its version is
    // too old: its client lists again, from the cache, rather than retry the refusal.
    let passage = match proxy.admit_upstream(req.uri(), req.headers(), &user) {
        Ok(p) => p,
        Err(e) => return respond::error(passed.older.as_ref().unwrap_or(&e)),
    };
    let head_timeout = (!long_running).then_some(app.api.opts.request_timeout);
    let req = req.map(RequestBody::into_outbound);
    let resp = proxy
        .forward(req, &user, peer, head_timeout, token, passage)
        .await;
    if !long_running {
        return match passed.passing {
            // A consistent list counts in flight until its response's last byte.
            Some(p) => resp.map(|body| respond::holding(body, p)),
            None => resp,
        };
    }
    // The watch's place is held until its stream ends, and the stream ends at shutdown.
    let mut stop = app.api.stop_watches.clone();
    let stopped: Stop = Box::pin(async move {
        crate::base::lifecycle::until_set(&mut stop).await;
    });
    resp.map(|body| Held::until(body, watch, stopped).boxed())
}
