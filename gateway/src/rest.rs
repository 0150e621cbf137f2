//! REST handlers, written once over `T: Resource`: get, list, watch, create, update, delete,
//! deletecollection. The kind table at the bottom is the only per-kind code.

pub mod list;
pub mod patch;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode, request};
use svc_core::codec::ProtoKind;
use svc_core::kinds::{Namespace, ServiceAccount};
use svc_core::object::{self, parse_resource_version};
use svc_core::{ApiError, Resource};
use svc_storage::{KeyValue, StoreError};

use crate::app::App;
use crate::negotiate::{self, Format};
use crate::pki::UserInfo;
use crate::query::Query;
use crate::respond::{self, Body};
use crate::router::ResourceRoute;

/// How long a read for a future resourceVersion waits for the store to reach it before 504.
const FUTURE_RV_WAIT: Duration = Duration::from_secs(3);

/// One request to a resource endpoint.
pub struct Call {
    pub parts: request::Parts,
    pub body: Bytes,
    pub route: ResourceRoute,
    pub query: Query,
    pub user: UserInfo,
    /// The negotiated response format (set before a handler runs).
    pub format: Format,
}

pub async fn serve(app: &Arc<App>, call: Call) -> Response<Body> {
    let result = match call.route.info.kind {
        "Namespace" => serve_typed::<Namespace>(app, call).await,
        "ServiceAccount" => serve_typed::<ServiceAccount>(app, call).await,
        other => Err(ApiError::internal(format!("no handler for kind {other}"))),
    };
    result.unwrap_or_else(|e| respond::error(&e))
}

/// Every served kind: the object model plus its protobuf form.
pub trait Kind: Resource + ProtoKind {}
impl<T: Resource + ProtoKind> Kind for T {}

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
        (Method::GET | Method::HEAD, None) => list::list_or_watch::<T>(app, call).await,
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

/// The namespace of an object route, validated.
fn path_namespace<T: Resource>(route: &ResourceRoute) -> Result<&str, ApiError> {
    if T::INFO.namespaced() && route.namespace.is_empty() {
        return Err(ApiError::bad_request(
            "a namespace is required for this resource",
        ));
    }
    Ok(&route.namespace)
}

async fn get<T: Kind>(app: &Arc<App>, call: &Call, name: &str) -> Result<Response<Body>, ApiError> {
    let ns = path_namespace::<T>(&call.route)?;
    let key = Bytes::from(T::INFO.key(ns, name));
    let min_rv = match call.query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(parse_resource_version(rv)?),
    };
    if let Some(rv) = min_rv {
        wait_for_revision(app, rv).await?;
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

/// Waits (briefly) until the store has reached `rv`; a version from the future gets 504
/// `Too large resource version`, as Kubernetes answers.
pub(crate) async fn wait_for_revision(app: &App, rv: i64) -> Result<i64, ApiError> {
    let deadline = tokio::time::Instant::now() + FUTURE_RV_WAIT;
    loop {
        let current = app
            .store
            .current_revision()
            .await
            .map_err(respond::store_error)?;
        if current >= rv {
            return Ok(current);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::too_large_resource_version(rv, current));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The stored object at `key`, decoded, with its key-value.
async fn read_current<T: Resource>(
    app: &App,
    key: &Bytes,
    name: &str,
) -> Result<(T, KeyValue), ApiError> {
    let (kv, _) = app
        .store
        .get(key.clone(), None)
        .await
        .map_err(respond::store_error)?;
    let kv = kv.ok_or_else(|| ApiError::NotFound(object::subject::<T>(name)))?;
    Ok((object::decode_from_store(&kv)?, kv))
}

fn conflict<T: Resource>(name: &str) -> ApiError {
    ApiError::Conflict {
        subject: object::subject::<T>(name),
        message: "the object has been modified; please apply your changes to the latest version \
                  and try again"
            .into(),
    }
}

fn map_write_error<T: Resource>(e: StoreError, name: &str) -> ApiError {
    match e {
        StoreError::AlreadyExists { .. } => ApiError::AlreadyExists(object::subject::<T>(name)),
        StoreError::Conflict { .. } => conflict::<T>(name),
        StoreError::NotFound => ApiError::NotFound(object::subject::<T>(name)),
        other => respond::store_error(other),
    }
}
