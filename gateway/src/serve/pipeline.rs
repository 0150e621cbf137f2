//! The pipeline every request takes, whether it came from a socket or from a controller
//! inside the server: route, authenticate, authorize, read the body, dispatch (resources,
//! health, metrics, discovery, OpenAPI), compress, account; with tracing on, each request is
//! a span (`trace.rs`) and everything it does runs in that span's context.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use opentelemetry::context::FutureExt as _;
use svc_core::ApiError;
use svc_core::user::UserInfo;

use crate::base::deadline::Deadline;
use crate::base::features::Feature;
use crate::base::query::Query;
use crate::base::router::{self, Route};
use crate::base::verb::Verb;
use crate::http::api::Standalone;
use crate::http::respond::{self, Body};
use crate::http::rest::serve as serve_resource;
use crate::security::authn;
use crate::security::authz::Attributes;
use crate::serve::app::{Mode, ServerState};
use crate::serve::audited;
use crate::serve::proxied;
pub use crate::serve::request::{Caller, H2Body, RequestBody};
use crate::serve::seats::{Admitted, admit};
use crate::{
    http::discovery, http::health, http::limits, http::openapi, http::openapi_v2, observe::metrics,
    observe::trace, security::audit,
};

impl RequestBody {
    /// The whole body, refused with 413 past `max` bytes.
    async fn read(self, max: usize) -> Result<Bytes, ApiError> {
        match self {
            RequestBody::Stream(body) => read_stream(body, max).await,
            RequestBody::H2(body) => read_stream(body, max).await,
            RequestBody::Full(b) if b.len() > max => Err(ApiError::RequestEntityTooLarge(format!(
                "the request body exceeds the limit of {max} bytes"
            ))),
            RequestBody::Full(b) => Ok(b),
        }
    }
}

/// Every request enters here: route, authenticate, authorize, dispatch, account.
pub async fn handle(
    app: Arc<ServerState>,
    caller: Caller,
    mut req: Request<RequestBody>,
) -> Response<Body> {
    // Shutdown sets `closing` before it stops the watches, so the flag alone says both.
    let closing = app.api.closing.load(std::sync::atomic::Ordering::Acquire);
    if closing && router::is_watch(req.uri()) {
        // Watches are about to end for shutdown: one accepted now would end within the second,
        // and client-go relists after such a "very short watch"; a 429 makes it retry the
        // watch from the version it holds, on the next server (kube-apiserver's
        // `--shutdown-send-retry-after` answers the same).
        return respond::error(&ApiError::TooManyRequests {
            message: "The apiserver is shutting down, please try again later.".into(),
            retry_after_seconds: Some(1),
        });
    }
    let own = match &app.mode {
        Mode::Upstream(proxy) => return proxied::handle(&app, proxy, caller, req).await,
        Mode::Store(own) => own,
    };
    let start = Instant::now();
    // The one branch tracing costs when it is off.
    let traced_since = app.api.tracer.as_ref().map(|_| SystemTime::now());
    let path = req.uri().path().to_string();
    let query = Query::parse(req.uri().query());
    let route = router::route(&path);
    let gzip_header = req.headers().get(http::header::ACCEPT_ENCODING).cloned();
    let watch = query.bool("watch").unwrap_or(false);
    let verb = Verb::of(req.method(), &route, watch);
    let info = metrics::RequestInfo::new(verb, req.method(), &route, &query, req.headers());
    let inflight = app.api.metrics.start(&info);

    let user = authenticate(&app, own, &caller, &req, &path).await;
    let trace_cx = match (&app.api.tracer, traced_since) {
        (Some(tracer), Some(since)) => Some(request_span(tracer, &req, &route, &user, since)),
        _ => None,
    };
    let work = async {
        match user {
            Err(e) => {
                let resp = respond::error(&e);
                match &own.security.audit {
                    None => (resp, None),
                    Some(auditor) => {
                        let begun = auditor.begin(&req, peer(&caller), &route, verb.as_str(), None);
                        let resp = match begun.record {
                            Some(r) => audited::failed_authentication(r, resp).await,
                            None => resp,
                        };
                        (resp, Some(begun.audit_id))
                    }
                }
            }
            Ok(user) => {
                // The one branch audit costs when it is off.
                let Some(auditor) = &own.security.audit else {
                    return (
                        serve(&app, own, req, route, query, verb, &path, user, None).await,
                        None,
                    );
                };
                let begun = auditor.begin(&req, peer(&caller), &route, verb.as_str(), Some(&user));
                let resp = match begun.record {
                    None => serve(&app, own, req, route, query, verb, &path, user, None).await,
                    Some(r) => {
                        req.extensions_mut().insert(r.annotations());
                        match r.received().await {
                            // blocking-strict: a request that cannot be audited is not served.
                            Err(e) => respond::error(&e),
                            Ok(()) => {
                                serve_audited(&app, own, req, route, query, verb, &path, user, r)
                                    .await
                            }
                        }
                    }
                };
                (resp, Some(begun.audit_id))
            }
        }
    };
    let (resp, audit_id) = match &trace_cx {
        None => work.await,
        Some(cx) => work.with_context(cx.clone()).await,
    };
    let resp = if matches!(verb, Verb::Get | Verb::List)
        && accepts_gzip(&gzip_header)
        && app
            .api
            .opts
            .feature_gates
            .enabled(Feature::APIResponseCompression)
    {
        gzip(resp, app.api.opts.response_compression_min_bytes).await
    } else {
        resp
    };
    let mut resp = resp;
    if let Some(id) = audit_id {
        resp.headers_mut().insert(audit::AUDIT_ID_HEADER, id);
    }
    let code = resp.status().as_u16();
    if let Some(cx) = &trace_cx {
        trace::end_request(cx, code);
    }
    drop(inflight);
    app.api.metrics.observe(&info, code, start.elapsed());
    tracing::debug!(verb = verb.as_str(), %path, code, elapsed_ms = start.elapsed().as_secs_f64() * 1e3, "request");
    resp
}

fn peer(caller: &Caller) -> Option<std::net::SocketAddr> {
    match caller {
        Caller::Connection(ident) => ident.peer,
        Caller::Internal(_) => None,
    }
}

/// The seats a request holds: a list of a stored kind as many as `limits::list_width` says
/// for the watch cache's count of the kind (Kubernetes counts the whole resource too), and
/// the `limit` if one is given; every other request one.
fn list_width(own: &Standalone, route: &Route, verb: Verb, query: &Query) -> usize {
    match route {
        Route::Resource(r) if verb == Verb::List && r.info.stored && r.subresource.is_none() => {
            let stored = own.registry.caches.get(r.info).stats().objects;
            limits::list_width(stored, query.get("limit").and_then(|l| l.parse().ok()))
        }
        _ => 1,
    }
}

async fn authenticate(
    app: &ServerState,
    own: &Standalone,
    caller: &Caller,
    req: &Request<RequestBody>,
    path: &str,
) -> Result<UserInfo, ApiError> {
    match caller {
        Caller::Connection(ident) => {
            authn::authenticate(
                &own.security,
                &own.registry,
                app.api.opts.anonymous_auth,
                ident,
                req.method(),
                path,
                req.headers(),
            )
            .await
        }
        Caller::Internal(user) => Ok(user.clone()),
    }
}

/// The request's span, begun when the request arrived: a child of the incoming `traceparent`
/// when the authenticated user may set it, and the parent of a span recording the
/// authentication just done.
fn request_span(
    tracer: &trace::Tracer,
    req: &Request<RequestBody>,
    route: &Route,
    user: &Result<UserInfo, ApiError>,
    since: SystemTime,
) -> opentelemetry::Context {
    use opentelemetry::KeyValue;
    let resource = match route {
        Route::Resource(r) => Some((
            r.info,
            !r.namespace.is_empty(),
            r.name.is_some(),
            r.subresource.as_deref(),
        )),
        _ => None,
    };
    let name = trace::request_span_name(req.method(), resource);
    let mut attributes = vec![
        KeyValue::new("http.method", req.method().as_str().to_string()),
        KeyValue::new(
            "http.target",
            req.uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_string(), ToString::to_string),
        ),
        KeyValue::new(
            "http.flavor",
            match req.version() {
                http::Version::HTTP_2 => "2",
                http::Version::HTTP_10 => "1.0",
                _ => "1.1",
            },
        ),
    ];
    if let Some(agent) = req
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        attributes.push(KeyValue::new("http.user_agent", agent.to_string()));
    }
    let cx = tracer.request_span(
        name,
        attributes,
        trace::incoming(req.headers()),
        user.as_ref().ok(),
        since,
    );
    tracer.record_child(
        &cx,
        "authentication",
        since,
        SystemTime::now(),
        user.as_ref().err().map(ToString::to_string),
    );
    cx
}

/// An audited request: [`serve`], with a `Panic` event (and a 500) if a handler panics,
/// then the response stages.
#[allow(clippy::too_many_arguments)]
async fn serve_audited(
    app: &Arc<ServerState>,
    own: &Arc<Standalone>,
    req: Request<RequestBody>,
    route: Route,
    query: Query,
    verb: Verb,
    path: &str,
    user: UserInfo,
    mut record: audit::Record,
) -> Response<Body> {
    use futures::FutureExt as _;
    let served = std::panic::AssertUnwindSafe(serve(
        app,
        own,
        req,
        route,
        query,
        verb,
        path,
        user,
        Some(&mut record),
    ))
    .catch_unwind()
    .await;
    match served {
        Ok(resp) => audited::finish(record, resp).await,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(%path, message, "a request handler panicked");
            audited::panicked(record, &message).await
        }
    }
}

/// Authorize, apply the in-flight limits, dispatch.
#[allow(clippy::too_many_arguments)]
async fn serve(
    app: &Arc<ServerState>,
    own: &Arc<Standalone>,
    req: Request<RequestBody>,
    route: Route,
    query: Query,
    verb: Verb,
    path: &str,
    user: UserInfo,
    record: Option<&mut audit::Record>,
) -> Response<Body> {
    let attrs = match &route {
        Route::Resource(r) => Attributes::for_resource(r, verb.as_str()),
        _ => Attributes {
            verb: verb.as_str(),
            resource: None,
            path,
        },
    };
    let chain = own.security.authorizer();
    let decision = trace::in_span(
        app.api.tracer.as_ref(),
        "authorization",
        || vec![opentelemetry::KeyValue::new("verb", verb.to_string())],
        chain.authorize_with_reason(&user, &attrs),
        |r| r.as_ref().err().map(|(e, _)| e.to_string()),
    )
    .await;
    if let Some(r) = &record {
        let (d, reason) = match &decision {
            Ok(reason) => ("allow", reason.as_str()),
            Err((_, reason)) => ("forbid", reason.as_str()),
        };
        r.annotate(audit::DECISION_ANNOTATION, d);
        r.annotate(audit::REASON_ANNOTATION, reason);
    }
    if let Err((e, _)) = decision {
        return respond::error(&e);
    }
    // Held until the request is done: a seat of its pool, or a watch's place until its
    // stream ends.
    let width = list_width(own, &route, verb, &query);
    let Admitted { watch, _seat } = match admit(app, &user, verb, width).await {
        Ok(admitted) => admitted,
        Err(why) => {
            if let Some(r) = &record {
                let limit = if verb == Verb::Watch {
                    "max-watches"
                } else if verb.is_mutating() {
                    "max-mutating-requests-inflight"
                } else {
                    "max-requests-inflight"
                };
                r.annotate(audit::RATE_LIMIT_ANNOTATION, limit);
            }
            return respond::error(&ApiError::too_many_requests(why.reason()));
        }
    };
    if let Some(place) = watch {
        return dispatch(app, own, req, route, query, verb, user, record)
            .await
            .map(|body| respond::holding(body, place));
    }
    if verb == Verb::Watch {
        return dispatch(app, own, req, route, query, verb, user, record).await;
    }
    match tokio::time::timeout(
        app.api.opts.request_timeout,
        dispatch(app, own, req, route, query, verb, user, record),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => respond::error(&ApiError::Timeout {
            message: "request did not complete within the allowed duration".into(),
            retry_after_seconds: None,
        }),
    }
}

#[allow(clippy::too_many_arguments)]
async fn dispatch(
    app: &Arc<ServerState>,
    own: &Arc<Standalone>,
    req: Request<RequestBody>,
    route: Route,
    query: Query,
    verb: Verb,
    user: UserInfo,
    record: Option<&mut audit::Record>,
) -> Response<Body> {
    let is_get = req.method() == Method::GET || req.method() == Method::HEAD;
    match route {
        Route::Resource(r) => {
            let (parts, body) = req.into_parts();
            let body = if matches!(
                parts.method,
                Method::POST | Method::PUT | Method::PATCH | Method::DELETE
            ) {
                match body.read(app.api.opts.max_request_body_bytes).await {
                    Ok(b) => {
                        if let Some(r) = record {
                            let json = audited::request_as_json(r, &parts.headers, &b);
                            r.request_body(&json);
                        }
                        b
                    }
                    Err(e) => return respond::error(&e),
                }
            } else {
                Bytes::new()
            };
            serve_resource(own, Request::from_parts(parts, body), r, query, verb, user).await
        }
        _ if !is_get => respond::error(&ApiError::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource: {}",
            req.method()
        ))),
        Route::Health { endpoint, check } => {
            health::serve(own, endpoint, check.as_deref(), &query).await
        }
        Route::Metrics => respond::bytes_response(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            app.api.metrics.encode(),
        ),
        Route::NotFound => respond::error(&ApiError::PathNotFound(req.uri().path().to_string())),
        Route::OpenApiV2 => {
            let header =
                |n: http::header::HeaderName| req.headers().get(n).and_then(|v| v.to_str().ok());
            openapi_v2::serve(
                header(http::header::ACCEPT),
                header(http::header::IF_NONE_MATCH),
            )
        }
        Route::OpenApiV3Index => openapi::serve_index(),
        Route::OpenApiV3 { group, version } => openapi::serve_group_version(&group, &version),
        other => discovery::serve(&other, query.pretty()),
    }
}

fn accepts_gzip(header: &Option<http::HeaderValue>) -> bool {
    let Some(v) = header.as_ref().and_then(|h| h.to_str().ok()) else {
        return false;
    };
    v.split(',').any(|part| {
        let mut it = part.split(';').map(str::trim);
        let coding = it.next().unwrap_or_default();
        let refused = it.any(|p| p.replace(' ', "") == "q=0" || p.replace(' ', "") == "q=0.0");
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

/// Compresses a complete response body with gzip (level 1: fastest, most of the gain on
/// JSON). Streams (watches) are left alone, and so are bodies under `min_bytes`
/// (`--response-compression-min-bytes`; 0, the default, compresses every body as the spec
/// says).
async fn gzip(resp: Response<Body>, min_bytes: usize) -> Response<Body> {
    use hyper::body::Body as _;
    if resp.headers().contains_key(http::header::CONTENT_ENCODING) {
        return resp;
    }
    let Some(len) = resp.body().size_hint().exact() else {
        return resp;
    };
    if len < min_bytes as u64 {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(collected) = body.collect().await else {
        return respond::error(&ApiError::internal("reading a response body to compress"));
    };
    let plain = collected.to_bytes();
    let compress = move || {
        use std::io::Write as _;
        let mut enc = flate2::write::GzEncoder::new(
            Vec::with_capacity(plain.len() / 4),
            flate2::Compression::fast(),
        );
        enc.write_all(&plain).and_then(|()| enc.finish())
    };
    // Large bodies are compressed off the async threads.
    let out = if len > 1 << 20 {
        tokio::task::spawn_blocking(compress)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    } else {
        compress()
    };
    match out {
        Ok(gz) => {
            parts.headers.insert(
                http::header::CONTENT_ENCODING,
                http::HeaderValue::from_static("gzip"),
            );
            parts.headers.remove(http::header::CONTENT_LENGTH);
            parts.headers.append(
                http::header::VARY,
                http::HeaderValue::from_static("Accept-Encoding"),
            );
            Response::from_parts(parts, respond::full(gz))
        }
        Err(e) => respond::error(&ApiError::internal(format!(
            "compressing the response: {e}"
        ))),
    }
}

/// How much of an oversized body is read and discarded before the 413 goes out, so a client
/// still writing it can read the answer instead of seeing a reset (Go's server does the same).
const OVERSIZE_DISCARD: usize = 256 * 1024;
const OVERSIZE_DISCARD_TIME: Duration = Duration::from_secs(1);

/// Reads a request body, refusing more than `max` bytes with 413 without buffering them.
async fn read_stream<B>(mut body: B, max: usize) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let too_large = || {
        ApiError::RequestEntityTooLarge(format!(
            "the request body exceeds the limit of {max} bytes"
        ))
    };
    let declared = hyper::body::Body::size_hint(&body).lower();
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    let discard_until = tokio::time::Instant::now().later(OVERSIZE_DISCARD_TIME);
    loop {
        let oversize = seen > max || declared > max as u64;
        if oversize
            && (seen > max.saturating_add(OVERSIZE_DISCARD)
                || tokio::time::Instant::now() > discard_until)
        {
            return Err(too_large());
        }
        let next = if oversize {
            match tokio::time::timeout_at(discard_until, body.frame()).await {
                Ok(f) => f,
                Err(_) => return Err(too_large()),
            }
        } else {
            body.frame().await
        };
        match next {
            None if oversize => return Err(too_large()),
            None => return Ok(buf.freeze()),
            Some(Err(e)) if oversize => {
                tracing::debug!(error = %e, "oversized body ended early");
                return Err(too_large());
            }
            Some(Err(e)) => {
                return Err(ApiError::bad_request(format!(
                    "reading the request body: {e}"
                )));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    seen = seen.saturating_add(data.len());
                    if seen <= max && declared <= max as u64 {
                        buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}
