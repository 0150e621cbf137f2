//! PATCH: JSON Patch, merge patch, strategic merge patch and server-side apply
//! (`application/apply-patch+yaml`), with optimistic concurrency on the store revision,
//! conditional patches (`metadata.resourceVersion` in the patch), `managedFields`
//! bookkeeping, field validation warnings, dry-run, and apply creating a missing object.
//! The patch algorithms themselves live in `svc_core::patch`.

use std::sync::Arc;

use http::{Response, StatusCode, header};
use serde_json::{Value, json};
use svc_core::patch::managed;
use svc_core::patch::{self as core_patch, PatchType};
use svc_core::registry::Kind;
use svc_core::status::StatusCause;
use svc_core::strict::{self as decode, FieldValidation};
use svc_core::{ApiError, Resource};
use svc_core::{codec, object};

use super::call::{RestRequest, authorize_also, field_manager, path_namespace};
use super::write::written_response;
use crate::base::features::Feature;
use crate::http::api::Standalone;
use crate::http::negotiate;
use crate::http::respond::Body;
use crate::registry;
use crate::registry::write::{Fields, WriteRequest};

/// How often an apply that finds its object created concurrently starts again.
const MAX_RETRIES: usize = 8;

/// The body of an apply request: YAML, of which JSON is a subset, or CBOR when its media type
/// says so. Duplicate keys are reported like JSON's (Strict refuses them); YAML's and CBOR's
/// parsers refuse them themselves.
fn parse_apply_body(body: &[u8], cbor: bool) -> Result<(Value, Vec<String>), ApiError> {
    if cbor {
        return Ok((codec::cbor::decode(body)?, vec![]));
    }
    if let Ok(parsed) = decode::parse_json(body) {
        return Ok(parsed);
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("error decoding YAML: the body is not UTF-8"))?;
    let opts = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    };
    let v: Value = serde_saphyr::from_str_with_options(text, opts)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    Ok((v, vec![]))
}

/// An apply configuration must name this type and, if it names one, this object.
fn check_apply_config<T: Resource>(config: &Value, name: &str) -> Result<(), ApiError> {
    let info = T::INFO;
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "error decoding YAML: an applied configuration must be an object",
        ));
    }
    let api_version = config
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = config.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version.is_empty() || kind.is_empty() {
        return Err(ApiError::bad_request(
            "apiVersion and kind must be set in an applied configuration",
        ));
    }
    if kind != info.kind || api_version != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "the applied configuration is a {api_version}, Kind={kind}, not a {}, Kind={}",
            info.api_version(),
            info.kind
        )));
    }
    match config.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n != name => Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// Decodes a patched JSON value into `T`, collecting unknown fields for field validation.
fn decode_patched<T: Resource>(v: Value, problems: &mut Vec<String>) -> Result<T, ApiError> {
    let (mut obj, unknown): (T, _) = decode::decode_value(v).map_err(|e| {
        ApiError::bad_request(format!("error decoding patched {}: {e}", T::INFO.kind))
    })?;
    problems.extend(unknown);
    object::check_type_meta(&obj)?;
    obj.set_type_meta();
    Ok(obj)
}

/// What a PATCH asks for, read from its `Content-Type` and query.
struct PatchOptions {
    patch_type: PatchType,
    /// An apply configuration in CBOR (`application/apply-patch+cbor`).
    cbor: bool,
    dry_run: bool,
    validation: FieldValidation,
    force: bool,
    manager: String,
}

fn patch_options(app: &Standalone, call: &RestRequest) -> Result<PatchOptions, ApiError> {
    let content_type = call
        .parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let unsupported = || {
        ApiError::UnsupportedMediaType(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, \
             application/apply-patch+yaml, application/strategic-merge-patch+json"
                .into(),
        )
    };
    let patch_type = PatchType::from_content_type(content_type).ok_or_else(unsupported)?;
    let cbor = negotiate::essence(content_type) == "application/apply-patch+cbor";
    // CBOR apply configurations are served only behind the gate that serves CBOR at all.
    if cbor
        && !app
            .api
            .opts
            .feature_gates
            .enabled(Feature::CBORServingAndStorage)
    {
        return Err(unsupported());
    }
    let force = call.query.bool("force")?;
    let is_apply = patch_type == PatchType::Apply;
    if force && !is_apply {
        return Err(call.invalid_options(StatusCause {
            reason: "FieldValueForbidden".into(),
            message: "Forbidden: may not be specified for non-apply patch".into(),
            field: "force".into(),
        }));
    }
    Ok(PatchOptions {
        patch_type,
        cbor,
        dry_run: call.dry_run()?,
        validation: call.field_validation()?,
        force,
        manager: field_manager(call, is_apply)?,
    })
}

pub async fn patch<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let PatchOptions {
        patch_type,
        cbor,
        dry_run,
        validation,
        force,
        manager,
    } = patch_options(app, call)?;
    let is_apply = patch_type == PatchType::Apply;
    if call.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let ns = path_namespace::<T>(&call.route)?.to_string();
    let api_version = T::INFO.api_version();

    // Problems in the patch body itself (duplicate keys) are the same on every retry.
    let mut body_problems = vec![];
    let apply_config = if is_apply {
        let (config, dups) = parse_apply_body(&call.body, cbor)?;
        check_apply_config::<T>(&config, name)?;
        body_problems.extend(dups);
        Some(config)
    } else {
        if patch_type != PatchType::Json
            && let Ok((_, dups)) = decode::parse_json(&call.body)
        {
            body_problems.extend(dups);
        }
        None
    };
    let req = call.write_request(dry_run);
    let fields = match is_apply {
        true => Fields::Applied,
        false => Fields::Update { manager: &manager },
    };
    // The patch is applied to the stored object, and again to a newer one after a
    // concurrent write, as Kubernetes does.
    let mut change = |current: &T| {
        let writer = registry::write::writer::<T>(&api_version, &manager);
        let current_value = serde_json::to_value(current).map_err(ApiError::internal)?;
        let patched = match &apply_config {
            Some(config) => managed::apply(
                &writer,
                &current_value,
                config,
                &current.meta().managed_fields,
                force,
            )?,
            None => core_patch::apply_patch(
                T::INFO.strategies(),
                patch_type,
                &current_value,
                &call.body,
            )?,
        };
        let mut problems = body_problems.clone();
        let next: T = decode_patched(patched, &mut problems)?;
        Ok((next, validation.check(problems)?))
    };
    for _ in 0..MAX_RETRIES {
        match registry::write::update(&app.registry, &req, &ns, name, &mut change, fields).await {
            Ok(updated) => {
                return Ok(written_response(
                    call,
                    StatusCode::OK,
                    &updated.written,
                    &updated.warnings,
                ));
            }
            Err(ApiError::NotFound(_)) if let Some(config) = &apply_config => {
                authorize_also(app, call, "create").await?;
                let create = ApplyCreate {
                    ns: &ns,
                    name,
                    manager: &manager,
                    config,
                    problems: body_problems.clone(),
                    validation,
                };
                match apply_create::<T>(app, call, &req, create).await {
                    // Created concurrently: apply to that object instead.
                    Err(ApiError::AlreadyExists(_)) => continue,
                    created => return created,
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(registry::write::conflict::<T>(name))
}

/// What an apply to a missing object creates it from.
struct ApplyCreate<'a> {
    ns: &'a str,
    name: &'a str,
    manager: &'a str,
    config: &'a Value,
    problems: Vec<String>,
    validation: FieldValidation,
}

/// Apply to a missing object creates it (the verb is then create): the configuration applied
/// to an empty object of the kind, created through the registry with the managed fields the
/// apply computed. `AlreadyExists` when another writer created it first.
async fn apply_create<T: Kind>(
    app: &Arc<Standalone>,
    call: &RestRequest,
    req: &WriteRequest<'_>,
    create: ApplyCreate<'_>,
) -> Result<Response<Body>, ApiError> {
    let ApplyCreate {
        ns,
        name,
        manager,
        config,
        mut problems,
        validation,
    } = create;
    let api_version = T::INFO.api_version();
    let writer = registry::write::writer::<T>(&api_version, manager);
    let mut stub = json!({
        "apiVersion": api_version,
        "kind": T::INFO.kind,
        "metadata": {"name": name},
    });
    if T::INFO.namespaced()
        && let Some(metadata) = stub.get_mut("metadata").and_then(Value::as_object_mut)
    {
        metadata.insert("namespace".into(), json!(ns));
    }
    let applied = managed::apply(&writer, &stub, config, &[], false)?;
    let obj: T = decode_patched(applied, &mut problems)?;
    let warnings = validation.check(problems)?;
    if !obj.meta().resource_version.is_empty() {
        // A precondition on an object that does not exist cannot hold.
        return Err(ApiError::NotFound(object::subject::<T>(name)));
    }
    let written = registry::write::create(&app.registry, req, ns, obj, Fields::Applied).await?;
    Ok(written_response(
        call,
        StatusCode::CREATED,
        &written,
        &warnings,
    ))
}
