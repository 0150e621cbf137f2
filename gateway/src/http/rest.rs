//! REST handlers, written once over every served kind: get here, list (`list`), watch
//! (`watch`), create/update/delete (`write`) and patch/apply (`patch`); what they share is in
//! `call`. The kind table in `serve` is the only per-kind code.
//!
//! Layering inside: `call` is the leaf; `list` and `watch` are siblings that never call each
//! other (this file picks one); `patch` builds on `write`'s commit step, never the reverse.

mod action;
mod body;
mod call;
pub mod list;
pub mod patch;
mod token;
pub mod watch;
pub mod write;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use svc_core::object::parse_resource_version;
use svc_core::user::UserInfo;
use svc_core::{ApiError, registry};

use call::{RestRequest, Selectors, path_namespace};

use crate::base::features::Feature;
use crate::base::query::{ListOptions, Query};
use crate::base::router::ResourceRoute;
use crate::base::verb::Verb;
use crate::http::api::Standalone;
use crate::http::negotiate;
use crate::http::respond::{self, Body};
use svc_core::registry::{Kind, KindVisitor};

/// Serves one resource request (its body read whole) with the handlers instantiated for the
/// route's kind: the one entry point of the handlers, so that the pipeline names none of
/// their types. The answer, and every error after content negotiation, is in the negotiated
/// format (a protobuf client gets its `Status` in protobuf, as from kube-apiserver).
pub async fn serve(
    app: &Arc<Standalone>,
    req: Request<Bytes>,
    route: ResourceRoute,
    query: Query,
    verb: Verb,
    user: UserInfo,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let watch = query.bool("watch").unwrap_or(false);
    let format =
        match negotiate::response_format(&parts.headers, &app.api.opts.feature_gates, watch) {
            Ok(format) => format,
            Err(e) => return respond::error(&e),
        };
    let call = RestRequest {
        parts,
        body,
        route,
        query,
        verb,
        user,
        format,
    };
    let info = call.route.info;
    let result = match registry::visit(info, Serve { app, call }) {
        Some(fut) => fut.await,
        None => Err(ApiError::internal(format!(
            "no handler for kind {}",
            info.kind
        ))),
    };
    result.unwrap_or_else(|e| respond::error_in(&e, format))
}

type Handled<'a> = Pin<Box<dyn Future<Output = Result<Response<Body>, ApiError>> + Send + 'a>>;

/// The registry visitor that picks `serve_typed::<T>` for the kind of a route.
struct Serve<'a> {
    app: &'a Arc<Standalone>,
    call: RestRequest,
}

impl<'a> KindVisitor for Serve<'a> {
    type Output = Handled<'a>;
    fn visit<T: Kind>(self) -> Handled<'a> {
        Box::pin(serve_typed::<T>(self.app, self.call))
    }
}

async fn serve_typed<T: Kind>(
    app: &Arc<Standalone>,
    call: RestRequest,
) -> Result<Response<Body>, ApiError> {
    let info = T::INFO;
    let name = call.route.name.clone();
    let method = call.parts.method.clone();
    if let Some(sub) = call.route.subresource.clone() {
        return serve_subresource::<T>(app, call, &sub).await;
    }
    // A write to a collection other than create, or to a named object by POST, has no verb
    // of its own (`Verb::of` names it by method alone): it is not served.
    let verb = match (call.verb, &name) {
        (Verb::Create, Some(_)) | (Verb::Update | Verb::Patch, None) => None,
        (v, _) => Some(v.as_str()),
    };
    if !verb.is_some_and(|v| info.verbs.contains(&v)) {
        return Err(method_not_allowed(&method));
    }
    if !info.stored {
        // Only `create` is served for a kind that is not stored: it is answered, not kept.
        return action::review::<T>(app, &call).await;
    }
    match (method, name) {
        (Method::GET | Method::HEAD, Some(name)) => get::<T>(app, &call, &name).await,
        (Method::GET | Method::HEAD, None) => list_or_watch::<T>(app, call).await,
        (Method::POST, None) => write::create::<T>(app, &call).await,
        (Method::PUT, Some(name)) => write::update::<T>(app, &call, &name).await,
        (Method::DELETE, Some(name)) => write::delete::<T>(app, &call, &name).await,
        (Method::DELETE, None) => write::delete_collection::<T>(app, &call).await,
        (Method::PATCH, Some(name)) => patch::patch::<T>(app, &call, &name).await,
        (m, _) => Err(method_not_allowed(&m)),
    }
}

fn method_not_allowed(m: &Method) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "the server does not allow this method on the requested resource: {m}"
    ))
}

/// A request to `<object>/<sub>`: reads and writes of the part of the object the
/// subresource owns (`status`, `approval`), or an action it performs (`token`).
async fn serve_subresource<T: Kind>(
    app: &Arc<Standalone>,
    call: RestRequest,
    sub: &str,
) -> Result<Response<Body>, ApiError> {
    let info = T::INFO;
    let name = call.route.name.clone().unwrap_or_default();
    let Some(served) = info.subresources.iter().find(|s| s.name == sub) else {
        return Err(ApiError::NotFound(svc_core::status::Subject::new(
            info.group,
            &format!("{}/{sub}", info.plural),
            &name,
        )));
    };
    let method = call.parts.method.clone();
    if !served.verbs.contains(&call.verb.as_str()) {
        return Err(method_not_allowed(&method));
    }
    match call.verb {
        Verb::Get => get::<T>(app, &call, &name).await,
        Verb::Update => write::update::<T>(app, &call, &name).await,
        Verb::Patch => patch::patch::<T>(app, &call, &name).await,
        _ => action::create::<T>(app, &call, sub, &name).await,
    }
}

async fn get<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let ns = path_namespace::<T>(&call.route)?;
    let min_rv = match call.query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(parse_resource_version(rv)?),
    };
    let obj: T = crate::registry::read::get(&app.registry, ns, name, min_rv).await?;
    Ok(respond::object(
        StatusCode::OK,
        &obj,
        call.format,
        call.query.pretty(),
    ))
}

async fn list_or_watch<T: Kind>(
    app: &Arc<Standalone>,
    call: RestRequest,
) -> Result<Response<Body>, ApiError> {
    let opts = ListOptions::from_query(&call.query)?;
    crate::registry::list::validate(&opts)?;
    if opts.watch
        && opts.send_initial_events.is_some()
        && !app.api.opts.feature_gates.enabled(Feature::WatchList)
    {
        // 422 Invalid `ListOptions`, as kube-apiserver refuses it.
        return Err(ApiError::Invalid {
            kind: "ListOptions".into(),
            group: "meta.svc.io".into(),
            name: String::new(),
            causes: vec![svc_core::status::StatusCause {
                reason: "FieldValueForbidden".into(),
                message: "Forbidden: sendInitialEvents is forbidden for watch unless the \
                          WatchList feature gate is enabled"
                    .into(),
                field: "sendInitialEvents".into(),
            }],
        });
    }
    let selectors = Selectors::parse::<T>(&opts)?;
    // Only read when the request is traced.
    let rv = app
        .api
        .tracer
        .as_ref()
        .and_then(|_| opts.resource_version.clone());
    let attributes = move || {
        vec![
            opentelemetry::KeyValue::new("type", T::INFO.plural),
            opentelemetry::KeyValue::new("resourceVersion", rv.unwrap_or_default()),
        ]
    };
    let failed = |r: &Result<Response<Body>, ApiError>| r.as_ref().err().map(ToString::to_string);
    if opts.watch {
        // The span covers setting the watch up (catching up, the initial events' snapshot),
        // not the stream: its events are written outside the request's context.
        return crate::observe::trace::in_span(
            app.api.tracer.as_ref(),
            "watch setup",
            attributes,
            watch::watch::<T>(app, call, opts, selectors),
            failed,
        )
        .await;
    }
    crate::observe::trace::in_span(
        app.api.tracer.as_ref(),
        "list",
        attributes,
        list::list::<T>(app, &call, &opts, selectors),
        failed,
    )
    .await
}
