//! The handlers of create (POST), update (PUT), delete and deletecollection: the request
//! body decoded (the one decoder of object bodies, [`decode_body`]), delete options and
//! dry-run read from the request, the registry's typed write called, its answer encoded.

use std::sync::Arc;

use http::{Response, StatusCode};
use svc_core::codec::{self, DeleteOptions};
use svc_core::registry::Kind;
use svc_core::{ApiError, Status};

use super::body::{self, Versions};
use super::call::{RestRequest, authorize_also, field_manager, path_namespace, response_warnings};
use crate::base::features::Feature;
use crate::http::api::Standalone;
use crate::http::negotiate::{self, Format};
use crate::http::respond::{self, Body};
use crate::registry;
use crate::registry::write::{Deletion, Fields, Written};

/// The object in the request body, with field validation's warnings.
fn decode_body<T: Kind>(
    app: &Standalone,
    call: &RestRequest,
) -> Result<(T, Vec<String>), ApiError> {
    let decoded = body::decode_object::<T>(app, call, Versions::Own)?;
    Ok((decoded.object, decoded.warnings))
}

/// POST: a new object from the body, created through the registry; 201 with it.
pub async fn create<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
) -> Result<Response<Body>, ApiError> {
    let dry_run = call.dry_run()?;
    let (obj, warnings): (T, _) = decode_body(app, call)?;
    let manager = field_manager(call, false)?;
    let written = registry::write::create(
        &app.registry,
        &call.write_request(dry_run),
        &call.route.namespace,
        obj,
        Fields::Update { manager: &manager },
    )
    .await?;
    Ok(written_response(
        call,
        StatusCode::CREATED,
        &written,
        &warnings,
    ))
}

/// The response to a write: the object, with field validation's and admission's warnings.
pub(super) fn written_response<T: Kind>(
    call: &RestRequest,
    code: StatusCode,
    written: &Written<T>,
    warnings: &[String],
) -> Response<Body> {
    respond::with_warnings(
        respond::object(code, &written.object, call.format, call.query.pretty()),
        &response_warnings(warnings, &written.outcome),
    )
}

/// PUT: the body replaces the stored object (creating it where the kind allows that).
pub async fn update<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let dry_run = call.dry_run()?;
    let (mut obj, warnings): (T, _) = decode_body(app, call)?;
    let ns = path_namespace::<T>(&call.route)?.to_string();
    if obj.meta().name.is_empty() {
        obj.meta_mut().name = name.to_string();
    }
    let manager = field_manager(call, false)?;
    let req = call.write_request(dry_run);
    let mut change = |_: &T| Ok((obj.clone(), warnings.clone()));
    let fields = Fields::Update { manager: &manager };
    match registry::write::update(&app.registry, &req, &ns, name, &mut change, fields).await {
        Ok(updated) => Ok(written_response(
            call,
            StatusCode::OK,
            &updated.written,
            &updated.warnings,
        )),
        Err(ApiError::NotFound(_))
            if T::INFO.allow_create_on_update && call.route.subresource.is_none() =>
        {
            let written = registry::write::create(&app.registry, &req, &ns, obj, fields).await?;
            Ok(written_response(
                call,
                StatusCode::CREATED,
                &written,
                &warnings,
            ))
        }
        Err(e) => Err(e),
    }
}

fn delete_options(call: &RestRequest) -> Result<(DeleteOptions, bool), ApiError> {
    // DeleteOptions::from_json / from_protobuf check the kind.
    let mut opts = if call.body.is_empty() {
        DeleteOptions::default()
    } else {
        match negotiate::request_format(&call.parts.headers, &Default::default())? {
            Format::Protobuf(_) => DeleteOptions::from_protobuf(&call.body)?,
            Format::Yaml => codec::yaml::decode(&call.body)?,
            _ => DeleteOptions::from_json(&call.body)?,
        }
    };
    if let Some(g) = call.query.int("gracePeriodSeconds")? {
        opts.grace_period_seconds = Some(g);
    }
    if opts.grace_period_seconds.is_some_and(|g| g < 0) {
        return Err(invalid_delete(
            "gracePeriodSeconds",
            "must be greater than or equal to 0",
        ));
    }
    if let Some(p) = call.query.get("propagationPolicy") {
        opts.propagation_policy = Some(p.to_string());
    }
    if let Some(p) = &opts.propagation_policy
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(invalid_delete(
            "propagationPolicy",
            &format!(
                "Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            ),
        ));
    }
    let dry_run = if opts.dry_run.is_empty() {
        call.dry_run()?
    } else {
        crate::base::query::dry_run(&opts.dry_run).map_err(|c| call.invalid_options(c))?
    };
    Ok((opts, dry_run))
}

fn invalid_delete(field: &str, message: &str) -> ApiError {
    ApiError::Invalid {
        kind: "DeleteOptions".into(),
        group: String::new(),
        name: String::new(),
        causes: vec![svc_core::status::StatusCause {
            reason: "FieldValueInvalid".into(),
            message: message.into(),
            field: field.into(),
        }],
    }
}

pub async fn delete<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let (opts, dry_run) = delete_options(call)?;
    let ns = path_namespace::<T>(&call.route)?.to_string();
    let pre = opts.preconditions.unwrap_or_default();
    let unsafe_delete = unsafe_delete_requested(app, call, dry_run)?;
    if unsafe_delete {
        authorize_also(app, call, "unsafe-delete-ignore-read-errors").await?;
    }
    let req = call.write_request(dry_run);
    match registry::write::delete::<T>(&app.registry, &req, &ns, name, &pre).await {
        // A kind that does not return deleted objects answers a removal with a Status naming
        // it (Kubernetes' `ReturnDeletedObject`); an object finalizers keep is answered itself.
        Ok((obj, Deletion::Removed)) if !T::INFO.delete_returns_object => Ok(respond::status_in(
            StatusCode::OK,
            &Status::success(Some(svc_core::status::StatusDetails {
                name: name.to_string(),
                group: T::INFO.group.to_string(),
                kind: T::INFO.plural.to_string(),
                uid: obj.meta().uid.clone(),
                ..Default::default()
            })),
            call.format,
            call.query.pretty(),
        )),
        // 200 whether the delete removed, marked or found the object terminating, as
        // kube-apiserver answers (its 202 is for orphanDependents=false alone).
        Ok((obj, _)) => Ok(respond::object(
            StatusCode::OK,
            &obj,
            call.format,
            call.query.pretty(),
        )),
        Err(e)
            if unsafe_delete
                && registry::write::is_corrupt::<T>(&app.registry, &ns, name).await =>
        {
            // The object cannot be read: remove the record unconditionally, ignoring
            // finalizers and preconditions, as the spec's alpha force deletion does.
            tracing::warn!(namespace = %ns, name, error = %e,
                "unsafe deletion of a corrupt object");
            registry::write::delete_unreadable::<T>(&app.registry, &ns, name).await?;
            Ok(respond::status_in(
                StatusCode::OK,
                &Status::success(Some(svc_core::status::StatusDetails {
                    name: name.to_string(),
                    group: T::INFO.group.to_string(),
                    kind: T::INFO.plural.to_string(),
                    ..Default::default()
                })),
                call.format,
                call.query.pretty(),
            ))
        }
        Err(e) => Err(e),
    }
}

/// `ignoreStoreReadErrorWithClusterBreakingPotential=true`: honoured only with the
/// `AllowUnsafeMalformedObjectDeletion` gate (otherwise the option does nothing, as an alpha
/// field behind a disabled gate), and never together with dry-run.
fn unsafe_delete_requested(
    app: &Standalone,
    call: &RestRequest,
    dry_run: bool,
) -> Result<bool, ApiError> {
    if !call
        .query
        .bool("ignoreStoreReadErrorWithClusterBreakingPotential")?
        || !app
            .api
            .opts
            .feature_gates
            .enabled(Feature::AllowUnsafeMalformedObjectDeletion)
    {
        return Ok(false);
    }
    if dry_run {
        return Err(invalid_delete(
            "ignoreStoreReadErrorWithClusterBreakingPotential",
            "Invalid value: true: cannot be set together with dryRun",
        ));
    }
    Ok(true)
}

pub async fn delete_collection<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
) -> Result<Response<Body>, ApiError> {
    let (opts, dry_run) = delete_options(call)?;
    let list_opts = crate::base::query::ListOptions::from_query(&call.query)?;
    let selectors = super::Selectors::parse::<T>(&list_opts)?;
    let pre = opts.preconditions.unwrap_or_default();
    let req = call.write_request(dry_run);
    registry::write::delete_collection::<T>(
        &app.registry,
        &req,
        &call.route.namespace,
        |obj: &T| selectors.matches(obj),
        &pre,
    )
    .await?;
    Ok(respond::status_in(
        StatusCode::OK,
        &Status::success(None),
        call.format,
        call.query.pretty(),
    ))
}
