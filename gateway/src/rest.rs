//! REST handlers, written once over every served kind: get here, list (`list`), watch
//! (`watch`), create/update/delete (`write`) and patch/apply (`patch`); what they share is in
//! `call`. The kind table in `serve` is the only per-kind code.
//!
//! Layering inside: `call` is the leaf; `list` and `watch` are siblings that never call each
//! other (this file picks one); `patch` builds on `write`'s commit step, never the reverse.

mod call;
pub mod list;
pub mod patch;
pub mod watch;
pub mod write;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use svc_core::ApiError;
use svc_core::kinds::{Namespace, ServiceAccount};
use svc_core::object::{self, parse_resource_version};

use call::path_namespace;
pub use call::{Call, Selectors};

use crate::app::App;
use crate::caches::freshness::wait_for_revision;
use crate::kind::Kind;
use crate::negotiate;
use crate::query::ListOptions;
use crate::respond::{self, Body};

pub async fn serve(app: &Arc<App>, call: Call) -> Response<Body> {
    let result = match call.route.info.kind {
        "Namespace" => serve_typed::<Namespace>(app, call).await,
        "ServiceAccount" => serve_typed::<ServiceAccount>(app, call).await,
        other => Err(ApiError::internal(format!("no handler for kind {other}"))),
    };
    result.unwrap_or_else(|e| respond::error(&e))
}

async fn serve_typed<T: Kind>(app: &Arc<App>, mut call: Call) -> Result<Response<Body>, ApiError> {
    let watch = call.query.bool("watch").unwrap_or(false);
    call.format = negotiate::response_format(&call.parts.headers, &app.opts.feature_gates, watch)?;
    let info = T::INFO;
    let name = call.route.name.clone();
    if let Some(sub) = &call.route.subresource {
        return Err(ApiError::NotFound(svc_core::status::Subject::new(
            info.group,
            &format!("{}/{sub}", info.plural),
            name.as_deref().unwrap_or_default(),
        )));
    }
    let method = call.parts.method.clone();
    match (method, name) {
        (Method::GET | Method::HEAD, Some(name)) => get::<T>(app, &call, &name).await,
        (Method::GET | Method::HEAD, None) => list_or_watch::<T>(app, call).await,
        (Method::POST, None) => write::create::<T>(app, &call).await,
        (Method::PUT, Some(name)) => write::update::<T>(app, &call, &name).await,
        (Method::DELETE, Some(name)) => write::delete::<T>(app, &call, &name).await,
        (Method::DELETE, None) => write::delete_collection::<T>(app, &call).await,
        (Method::PATCH, Some(name)) => patch::patch::<T>(app, &call, &name).await,
        (m, _) => Err(ApiError::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource: {m}"
        ))),
    }
}

async fn get<T: Kind>(app: &Arc<App>, call: &Call, name: &str) -> Result<Response<Body>, ApiError> {
    let ns = path_namespace::<T>(&call.route)?;
    let key = Bytes::from(T::INFO.key(ns, name));
    let min_rv = match call.query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(parse_resource_version(rv)?),
    };
    if let Some(rv) = min_rv {
        wait_for_revision(app.store.as_ref(), rv).await?;
    }
    let (kv, _) = app
        .store
        .get(key, None)
        .await
        .map_err(respond::store_error)?;
    let kv = kv.ok_or_else(|| ApiError::NotFound(object::subject::<T>(name)))?;
    let obj: T = object::decode_from_store(&kv)?;
    Ok(respond::object(
        StatusCode::OK,
        &obj,
        call.format,
        call.query.pretty(),
    ))
}

async fn list_or_watch<T: Kind>(app: &Arc<App>, call: Call) -> Result<Response<Body>, ApiError> {
    let opts = ListOptions::from_query(&call.query)?;
    list::validate(&opts)?;
    if opts.watch
        && opts.send_initial_events.is_some()
        && !app.opts.feature_gates.enabled("WatchList")
    {
        return Err(ApiError::bad_request(
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the \
             WatchList feature gate is enabled",
        ));
    }
    let selectors = Selectors::parse::<T>(&opts)?;
    if opts.watch {
        return watch::watch::<T>(app, call, opts, selectors).await;
    }
    list::list::<T>(app, &call, &opts, selectors).await
}
