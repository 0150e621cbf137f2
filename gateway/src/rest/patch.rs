//! PATCH: JSON Patch, merge patch, strategic merge patch and server-side apply
//! (`application/apply-patch+yaml`), with optimistic concurrency on the store revision,
//! conditional patches (`metadata.resourceVersion` in the patch), `managedFields`
//! bookkeeping, field validation warnings, dry-run, and apply creating a missing object.
//! The patch algorithms themselves live in `svc_core::patch`.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use serde_json::{Value, json};
use svc_core::meta::Time;
use svc_core::object::{self, parse_resource_version};
use svc_core::patch::managed::{self, Writer};
use svc_core::patch::{self as core_patch, PatchType};
use svc_core::status::StatusCause;
use svc_core::strict::{self as decode, FieldValidation};
use svc_core::{ApiError, Resource};
use svc_storage::StoreError;

use super::call::{
    Call, admission_attributes, authorize_also, conflict, field_manager, map_write_error,
    path_namespace, read_current, response_warnings, store_create,
};
use super::write::{self, Committed, check_namespace_open};
use crate::admission::{Operation, Outcome};
use crate::app::App;
use crate::kind::Kind;
use crate::respond::{self, Body};

/// How often a patch retries against a concurrent write before giving up with 409.
const MAX_RETRIES: usize = 8;

/// The body of an apply request: YAML, of which JSON is a subset. Duplicate keys are
/// reported like JSON's (Strict refuses them).
fn parse_apply_body(body: &[u8]) -> Result<(Value, Vec<String>), ApiError> {
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

pub async fn patch<T: Kind>(
    app: &Arc<App>,
    call: &Call,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let content_type = call
        .parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let patch_type = PatchType::from_content_type(content_type).ok_or_else(|| {
        ApiError::UnsupportedMediaType(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, \
             application/apply-patch+yaml, application/strategic-merge-patch+json"
                .into(),
        )
    })?;
    let dry_run = call.query.dry_run()?;
    let validation = FieldValidation::parse(call.query.get("fieldValidation"))?;
    let force = call.query.bool("force")?;
    let is_apply = patch_type == PatchType::Apply;
    if force && !is_apply {
        return Err(ApiError::Invalid {
            kind: "PatchOptions".into(),
            group: String::new(),
            name: String::new(),
            causes: vec![StatusCause {
                reason: "FieldValueForbidden".into(),
                message: "Forbidden: may not be specified for non-apply patch".into(),
                field: "force".into(),
            }],
        });
    }
    let manager = field_manager(call, is_apply)?;
    if call.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let ns = path_namespace::<T>(&call.route)?.to_string();
    let key = Bytes::from(T::INFO.key(&ns, name));
    let api_version = T::INFO.api_version();

    // Problems in the patch body itself (duplicate keys) are the same on every retry.
    let mut body_problems = vec![];
    let apply_config = if is_apply {
        let (config, dups) = parse_apply_body(&call.body)?;
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

    for _ in 0..MAX_RETRIES {
        let writer = Writer {
            kind: T::INFO.strategies(),
            api_version: &api_version,
            manager: &manager,
            now: Time::now(),
        };
        let mut problems = body_problems.clone();
        let (current, kv) = match read_current::<T>(app, &key, name).await {
            Ok(c) => c,
            Err(ApiError::NotFound(_)) if let Some(config) = &apply_config => {
                authorize_also(app, call, "create").await?;
                match apply_create::<T>(
                    app, call, &ns, name, &writer, config, dry_run, problems, validation,
                )
                .await?
                {
                    Some(resp) => return Ok(resp),
                    None => continue, // created concurrently: apply to it
                }
            }
            Err(e) => return Err(e),
        };
        let current_value = serde_json::to_value(&current).map_err(ApiError::internal)?;
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
        let mut next: T = decode_patched(patched, &mut problems)?;
        let warnings = validation.check(problems)?;

        // A resourceVersion in the patch makes it conditional.
        let precondition = match next.meta().resource_version.as_str() {
            "" => None,
            rv => Some(parse_resource_version(rv)?),
        };
        if precondition.is_some_and(|rv| rv != kv.mod_revision) {
            return Err(conflict::<T>(name));
        }
        if next.meta().name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                next.meta().name
            )));
        }
        object::apply_request_namespace(&mut next, &ns)?;
        let mut outcome = Outcome::default();
        let attrs = admission_attributes::<T>(call, Operation::Update, &ns, name, dry_run);
        app.admission
            .mutate(&attrs, &mut next, Some(&current), &mut outcome)
            .await?;
        object::prepare_update_via(
            &mut next,
            &current,
            call.route.subresource.as_deref(),
            &svc_core::ambient::System,
            &app.validator,
        )?;
        if !is_apply {
            let body_entries = next.meta().managed_fields.clone();
            let next_value = serde_json::to_value(&next).map_err(ApiError::internal)?;
            next.meta_mut().managed_fields = managed::update(
                &writer,
                Some(&current_value),
                &next_value,
                &current.meta().managed_fields,
                &body_entries,
            )?;
        }
        app.admission
            .validate(&attrs, Some(&next), Some(&current), &mut outcome)
            .await?;
        let warnings = response_warnings(&warnings, &outcome);
        let ok = |obj: &T| {
            respond::with_warnings(
                respond::object(StatusCode::OK, obj, call.format, call.query.pretty()),
                &warnings,
            )
        };
        match write::commit_update(app, &key, &kv, current, next, dry_run, name).await? {
            Committed::Done(obj) => return Ok(ok(&obj)),
            // The patch is re-applied to the newer object, as Kubernetes does; one that
            // carries a resourceVersion then fails the check above with 409.
            Committed::Stale => continue,
        }
    }
    Err(conflict::<T>(name))
}

/// Apply to a missing object creates it (the verb is then create). `None` when another
/// writer created it first, so the caller applies to that one instead.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename the list
async fn apply_create<T: Kind>(
    app: &Arc<App>,
    call: &Call,
    ns: &str,
    name: &str,
    writer: &Writer<'_>,
    config: &Value,
    dry_run: bool,
    mut problems: Vec<String>,
    validation: FieldValidation,
) -> Result<Option<Response<Body>>, ApiError> {
    let mut stub = json!({
        "apiVersion": T::INFO.api_version(),
        "kind": T::INFO.kind,
        "metadata": {"name": name},
    });
    if T::INFO.namespaced()
        && let Some(metadata) = stub.get_mut("metadata").and_then(Value::as_object_mut)
    {
        metadata.insert("namespace".into(), json!(ns));
    }
    let applied = managed::apply(writer, &stub, config, &[], false)?;
    let mut obj: T = decode_patched(applied, &mut problems)?;
    let warnings = validation.check(problems)?;
    if !obj.meta().resource_version.is_empty() {
        // A precondition on an object that does not exist cannot hold.
        return Err(ApiError::NotFound(object::subject::<T>(name)));
    }
    object::apply_request_namespace(&mut obj, ns)?;
    let mut outcome = Outcome::default();
    let attrs = admission_attributes::<T>(call, Operation::Create, ns, name, dry_run);
    app.admission
        .mutate(&attrs, &mut obj, None, &mut outcome)
        .await?;
    object::apply_request_namespace(&mut obj, ns)?;
    check_namespace_open::<T>(app, ns, name).await?;
    let managed_fields = obj.meta().managed_fields.clone();
    object::prepare_create_by(
        &mut obj,
        &call.user,
        &svc_core::ambient::System,
        &app.validator,
    )?;
    obj.meta_mut().managed_fields = managed_fields;
    app.admission
        .validate(&attrs, Some(&obj), None, &mut outcome)
        .await?;
    let warnings = response_warnings(&warnings, &outcome);
    let created = |obj: &T| {
        respond::with_warnings(
            respond::object(StatusCode::CREATED, obj, call.format, call.query.pretty()),
            &warnings,
        )
    };
    let key = Bytes::from(T::INFO.key(ns, name));
    if dry_run {
        return Ok(Some(created(&obj)));
    }
    let value = Bytes::from(object::encode_for_store(&obj)?);
    match store_create::<T>(app, key, value).await {
        Ok(kv) => {
            obj.meta_mut().resource_version = kv.mod_revision.to_string();
            Ok(Some(created(&obj)))
        }
        Err(StoreError::AlreadyExists { .. }) => Ok(None),
        Err(e) => Err(map_write_error::<T>(e, name)),
    }
}
