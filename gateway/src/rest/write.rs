//! Create, update (PUT), delete and deletecollection, with optimistic concurrency on the
//! store revision, namespace lifecycle checks, finalizers and dry-run.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use svc_core::codec::{self, DeleteOptions, Preconditions};
use svc_core::kinds::Namespace;
use svc_core::meta::Time;
use svc_core::object::{self, parse_resource_version};
use svc_core::patch::managed::{self, Writer};
use svc_core::status::Subject;
use svc_core::strict::{self as decode, FieldValidation};
use svc_core::{ApiError, Resource, Status};
use svc_storage::{KeyRange, KeyValue, StoreError};

use super::call::{
    Call, admission_attributes, authorize_also, conflict, field_manager, map_write_error,
    path_namespace, read_current, response_warnings, store_create, store_update,
};
use crate::admission::{Operation, Outcome};
use crate::app::App;
use crate::features::Feature;
use crate::kind::Kind;
use crate::negotiate::{self, Format};
use crate::respond::{self, Body};

/// How often a create retries a `generateName` collision, and an unconditional update a
/// concurrent write, before giving up.
const MAX_RETRIES: usize = 8;

/// Decodes a request body in the format its `Content-Type` names, with the warnings field
/// validation produces (unknown and duplicate JSON fields; `Strict` refuses them).
fn decode_body<T: Kind>(app: &App, call: &Call) -> Result<(T, Vec<String>), ApiError> {
    let format = negotiate::request_format(&call.parts.headers, &app.opts.feature_gates)?;
    let validation = FieldValidation::parse(call.query.get("fieldValidation"))?;
    if call.body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    match format {
        Format::Json => {
            let (value, mut problems) = decode::parse_json(&call.body).map_err(|e| {
                ApiError::bad_request(format!("error decoding {} body: {e}", T::INFO.kind))
            })?;
            let (mut obj, unknown): (T, _) = decode::decode_value(value).map_err(|e| {
                ApiError::bad_request(format!("error decoding {} body: {e}", T::INFO.kind))
            })?;
            problems.extend(unknown);
            let warnings = validation.check(problems)?;
            object::check_type_meta(&obj)?;
            obj.set_type_meta();
            Ok((obj, warnings))
        }
        // YAML and CBOR go through a JSON value, so unknown fields are found the same way
        // (both parsers refuse duplicate keys themselves).
        Format::Yaml | Format::Cbor => {
            let value: serde_json::Value = if format == Format::Yaml {
                codec::yaml::decode(&call.body)?
            } else {
                codec::cbor::decode(&call.body)?
            };
            let (mut obj, unknown): (T, _) = decode::decode_value(value).map_err(|e| {
                ApiError::bad_request(format!("error decoding {} body: {e}", T::INFO.kind))
            })?;
            let warnings = validation.check(unknown)?;
            object::check_type_meta(&obj)?;
            obj.set_type_meta();
            Ok((obj, warnings))
        }
        Format::Protobuf(_) => Ok((codec::decode_protobuf(&call.body)?, vec![])),
        Format::Table => Err(ApiError::UnsupportedMediaType(
            "a Table is not a request body".into(),
        )),
    }
}

/// Records a non-apply write in `next`'s `managedFields` as an `Update` by the request's
/// field manager; `old` is `None` on create.
fn record_update<T: Kind>(call: &Call, old: Option<&T>, next: &mut T) -> Result<(), ApiError> {
    let manager = field_manager(call, false)?;
    let api_version = T::INFO.api_version();
    let writer = Writer {
        kind: T::INFO.strategies(),
        api_version: &api_version,
        manager: &manager,
        now: Time::now(),
    };
    let old_value = old
        .map(serde_json::to_value)
        .transpose()
        .map_err(ApiError::internal)?;
    let current = old
        .map(|o| o.meta().managed_fields.clone())
        .unwrap_or_default();
    let body_entries = std::mem::take(&mut next.meta_mut().managed_fields);
    let new_value = serde_json::to_value(&*next).map_err(ApiError::internal)?;
    next.meta_mut().managed_fields = managed::update(
        &writer,
        old_value.as_ref(),
        &new_value,
        &current,
        &body_entries,
    )?;
    Ok(())
}

/// Namespaced objects may only be created in a namespace that exists and is not terminating.
pub(super) async fn check_namespace_open<T: Kind>(
    app: &App,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    if !T::INFO.namespaced() {
        return Ok(());
    }
    let key = Bytes::from(Namespace::INFO.key("", ns));
    let (kv, _) = app
        .store
        .get(key, None)
        .await
        .map_err(respond::store_error)?;
    let kv = kv.ok_or_else(|| ApiError::NotFound(Subject::new("", "namespaces", ns)))?;
    let nsobj: Namespace = object::decode_from_store(&kv)?;
    if nsobj.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::Forbidden(format!(
            "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because \
             it is being terminated",
            T::INFO.plural
        )));
    }
    Ok(())
}

pub async fn create<T: Kind>(app: &Arc<App>, call: &Call) -> Result<Response<Body>, ApiError> {
    let dry_run = call.query.dry_run()?;
    let (mut obj, warnings): (T, _) = decode_body(app, call)?;
    object::apply_request_namespace(&mut obj, &call.route.namespace)?;
    let mut outcome = Outcome::default();
    if !app.admission.is_empty() {
        let name = obj.meta().name.clone();
        let attrs = admission_attributes::<T>(
            call,
            Operation::Create,
            &call.route.namespace,
            &name,
            dry_run,
        );
        app.admission
            .mutate(&attrs, &mut obj, None, &mut outcome)
            .await?;
        // A plugin may not move the object to another namespace than the path's.
        object::apply_request_namespace(&mut obj, &call.route.namespace)?;
    }
    let ns = obj.meta().namespace.clone();
    let generated = obj.meta().name.is_empty() && !obj.meta().generate_name.is_empty();
    let requester = &call.user;
    for _ in 0..MAX_RETRIES {
        let mut candidate = obj.clone();
        object::prepare_create_by(
            &mut candidate,
            requester,
            &svc_core::ambient::System,
            &app.validator,
        )?;
        record_update(call, None, &mut candidate)?;
        let name = candidate.meta().name.clone();
        check_namespace_open::<T>(app, &ns, &name).await?;
        let attrs = admission_attributes::<T>(call, Operation::Create, &ns, &name, dry_run);
        app.admission
            .validate(&attrs, Some(&candidate), None, &mut outcome)
            .await?;
        let warnings = response_warnings(&warnings, &outcome);
        let key = Bytes::from(T::INFO.key(&ns, &name));
        if dry_run {
            let (existing, _) = app
                .store
                .get(key, None)
                .await
                .map_err(respond::store_error)?;
            if existing.is_some() {
                if generated {
                    continue;
                }
                return Err(ApiError::AlreadyExists(object::subject::<T>(&name)));
            }
            return Ok(respond::with_warnings(
                respond::object(
                    StatusCode::CREATED,
                    &candidate,
                    call.format,
                    call.query.pretty(),
                ),
                &warnings,
            ));
        }
        let value = Bytes::from(object::encode_for_store(&candidate)?);
        match store_create::<T>(app, key, value).await {
            Ok(kv) => {
                candidate.meta_mut().resource_version = kv.mod_revision.to_string();
                return Ok(respond::with_warnings(
                    respond::object(
                        StatusCode::CREATED,
                        &candidate,
                        call.format,
                        call.query.pretty(),
                    ),
                    &warnings,
                ));
            }
            Err(StoreError::AlreadyExists { .. }) if generated => continue,
            Err(e) => return Err(map_write_error::<T>(e, &name)),
        }
    }
    Err(ApiError::ServiceUnavailable(format!(
        "could not find a free name for generateName {:?} after {MAX_RETRIES} tries",
        obj.meta().generate_name
    )))
}

pub async fn update<T: Kind>(
    app: &Arc<App>,
    call: &Call,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let dry_run = call.query.dry_run()?;
    let (mut obj, warnings): (T, _) = decode_body(app, call)?;
    let ns = path_namespace::<T>(&call.route)?.to_string();
    object::apply_request_namespace(&mut obj, &ns)?;
    if obj.meta().name.is_empty() {
        obj.meta_mut().name = name.to_string();
    } else if obj.meta().name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            obj.meta().name
        )));
    }
    let precondition = match obj.meta().resource_version.as_str() {
        "" => None,
        rv => Some(parse_resource_version(rv)?),
    };
    let key = Bytes::from(T::INFO.key(&ns, name));
    let ok = |obj: &T, outcome: &Outcome| {
        respond::with_warnings(
            respond::object(StatusCode::OK, obj, call.format, call.query.pretty()),
            &response_warnings(&warnings, outcome),
        )
    };
    for _ in 0..MAX_RETRIES {
        let (current, kv) = match read_current::<T>(app, &key, name).await {
            Ok(c) => c,
            Err(ApiError::NotFound(s))
                if !T::INFO.allow_create_on_update || call.route.subresource.is_some() =>
            {
                return Err(ApiError::NotFound(s));
            }
            Err(ApiError::NotFound(_)) => return create::<T>(app, call).await,
            Err(e) => return Err(e),
        };
        if precondition.is_some_and(|rv| rv != kv.mod_revision) {
            return Err(conflict::<T>(name));
        }
        let mut next = obj.clone();
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
        record_update(call, Some(&current), &mut next)?;
        app.admission
            .validate(&attrs, Some(&next), Some(&current), &mut outcome)
            .await?;
        match commit_update(app, &key, &kv, current, next, dry_run, name).await? {
            Committed::Done(obj) => return Ok(ok(&obj, &outcome)),
            // An unconditional update retries against the newer object; a conditional one
            // reports the conflict.
            Committed::Stale if precondition.is_none() => continue,
            Committed::Stale => return Err(conflict::<T>(name)),
        }
    }
    Err(conflict::<T>(name))
}

/// What committing a prepared update did.
pub(super) enum Committed<T> {
    /// The object as stored now (unchanged, written, deleted, or as a dry run would store it).
    Done(T),
    /// Another write got in since `kv` was read: read again and retry, or report a conflict.
    Stale,
}

/// Commits `next` over the stored `current` (read as `kv`), the last step of every update
/// and patch: nothing when nothing changed (no new resourceVersion, no watch event), nothing
/// for a dry run, the deletion when the last finalizer of a terminating object is gone, and
/// otherwise a compare-and-swap write on `kv`'s revision.
pub(super) async fn commit_update<T: Kind>(
    app: &App,
    key: &Bytes,
    kv: &KeyValue,
    current: T,
    mut next: T,
    dry_run: bool,
    name: &str,
) -> Result<Committed<T>, ApiError> {
    next.meta_mut().resource_version.clear();
    let value = object::encode_for_store(&next)?;
    if value == kv.value {
        return Ok(Committed::Done(current));
    }
    if dry_run {
        next.meta_mut().resource_version = kv.mod_revision.to_string();
        return Ok(Committed::Done(next));
    }
    let finished = next.meta().deletion_timestamp.is_some()
        && next.meta().finalizers.is_empty()
        && !next.has_kind_finalizers();
    let written = if finished {
        app.store
            .delete(key.clone(), Some(kv.mod_revision))
            .await
            .map(|(_, rev)| rev)
    } else {
        store_update::<T>(app, key.clone(), Bytes::from(value), kv.mod_revision)
            .await
            .map(|kv| kv.mod_revision)
    };
    match written {
        Ok(rev) => {
            next.meta_mut().resource_version = rev.to_string();
            Ok(Committed::Done(next))
        }
        Err(StoreError::Conflict { .. }) => Ok(Committed::Stale),
        Err(e) => Err(map_write_error::<T>(e, name)),
    }
}

fn delete_options(call: &Call) -> Result<(DeleteOptions, bool), ApiError> {
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
    let dry_run = match opts.dry_run.as_slice() {
        [] => call.query.dry_run()?,
        [v] if v == "All" => true,
        other => {
            return Err(ApiError::bad_request(format!(
                "Invalid dryRun value {other:?}: supported values: \"All\""
            )));
        }
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
    app: &Arc<App>,
    call: &Call,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let (opts, dry_run) = delete_options(call)?;
    let ns = path_namespace::<T>(&call.route)?.to_string();
    let key = Bytes::from(T::INFO.key(&ns, name));
    let pre = opts.preconditions.unwrap_or_default();
    let unsafe_delete = unsafe_delete_requested(app, call, dry_run)?;
    if unsafe_delete {
        authorize_also(app, call, "unsafe-delete-ignore-read-errors").await?;
    }
    match delete_one::<T>(
        app,
        &key,
        name,
        &pre,
        dry_run,
        &call.user,
        call.parts.extensions.get(),
    )
    .await
    {
        Ok((obj, code)) => Ok(respond::object(
            code,
            &obj,
            call.format,
            call.query.pretty(),
        )),
        Err(e) if unsafe_delete && is_corrupt::<T>(app, &key).await => {
            // The object cannot be read: remove the record unconditionally, ignoring
            // finalizers and preconditions, as the spec's alpha force deletion does.
            tracing::warn!(key = %String::from_utf8_lossy(&key), error = %e,
                "unsafe deletion of a corrupt object");
            app.store
                .delete(key.clone(), None)
                .await
                .map_err(|e| map_write_error::<T>(e, name))?;
            Ok(respond::json(
                StatusCode::OK,
                &Status::success(Some(svc_core::status::StatusDetails {
                    name: name.to_string(),
                    group: T::INFO.group.to_string(),
                    kind: T::INFO.plural.to_string(),
                    ..Default::default()
                })),
                call.query.pretty(),
            ))
        }
        Err(e) => Err(e),
    }
}

/// `ignoreStoreReadErrorWithClusterBreakingPotential=true`: honoured only with the
/// `AllowUnsafeMalformedObjectDeletion` gate (otherwise the option does nothing, as an alpha
/// field behind a disabled gate), and never together with dry-run.
fn unsafe_delete_requested(app: &App, call: &Call, dry_run: bool) -> Result<bool, ApiError> {
    if !call
        .query
        .bool("ignoreStoreReadErrorWithClusterBreakingPotential")?
        || !app
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

/// Whether the record at `key` cannot be read or decoded (the corrupt-object case).
async fn is_corrupt<T: Kind>(app: &App, key: &Bytes) -> bool {
    match app.store.get(key.clone(), None).await {
        Err(StoreError::Corrupt { .. }) => true,
        Ok((Some(kv), _)) => object::decode_from_store::<T>(&kv).is_err(),
        _ => false,
    }
}

/// The user the namespace controller's sweep deletes as.
const NAMESPACE_CONTROLLER: &str = "system:svc-controller-manager:namespace-controller";

/// Deletes one object, or marks it terminating when finalizers hold it. Returns what the
/// client sees: the deleted object (200) or the terminating one (200; 202 while finalizing).
/// Validating admission sees the stored object first (deletes have no mutating phase).
async fn delete_one<T: Kind>(
    app: &App,
    key: &Bytes,
    name: &str,
    pre: &Preconditions,
    dry_run: bool,
    user: &svc_core::user::UserInfo,
    audit: Option<&crate::audit::Annotations>,
) -> Result<(T, StatusCode), ApiError> {
    for _ in 0..MAX_RETRIES {
        let (mut current, kv) = read_current::<T>(app, key, name).await?;
        if let Some(uid) = pre.uid.as_deref()
            && uid != current.meta().uid
        {
            return Err(ApiError::Conflict {
                subject: object::subject::<T>(name),
                message: format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current.meta().uid
                ),
            });
        }
        if let Some(rv) = pre.resource_version.as_deref()
            && rv != current.meta().resource_version
        {
            return Err(ApiError::Conflict {
                subject: object::subject::<T>(name),
                message: format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, \
                         ResourceVersion in object meta: {}",
                    current.meta().resource_version
                ),
            });
        }
        if !app.admission.is_empty() {
            let attrs = crate::admission::Attributes {
                operation: Operation::Delete,
                info: T::INFO,
                subresource: None,
                namespace: &current.meta().namespace,
                name,
                user,
                dry_run,
                audit,
            };
            app.admission
                .validate::<T>(&attrs, None, Some(&current), &mut Outcome::default())
                .await?;
        }
        if !current.meta().finalizers.is_empty() || current.has_kind_finalizers() {
            if current.meta().deletion_timestamp.is_some() {
                return Ok((current, StatusCode::ACCEPTED));
            }
            current.meta_mut().deletion_timestamp = Some(Time::now());
            current.meta_mut().deletion_grace_period_seconds = Some(0);
            current.mark_terminating();
            if dry_run {
                return Ok((current, StatusCode::ACCEPTED));
            }
            let value = Bytes::from(object::encode_for_store(&current)?);
            match store_update::<T>(app, key.clone(), value, kv.mod_revision).await {
                Ok(new_kv) => {
                    current.meta_mut().resource_version = new_kv.mod_revision.to_string();
                    if T::INFO.kind == Namespace::INFO.kind {
                        app.namespace_changed.notify_one();
                    }
                    return Ok((current, StatusCode::OK));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(map_write_error::<T>(e, name)),
            }
        }
        if dry_run {
            return Ok((current, StatusCode::OK));
        }
        match app.store.delete(key.clone(), Some(kv.mod_revision)).await {
            Ok(_) => return Ok((current, StatusCode::OK)),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(map_write_error::<T>(e, name)),
        }
    }
    Err(conflict::<T>(name))
}

pub async fn delete_collection<T: Kind>(
    app: &Arc<App>,
    call: &Call,
) -> Result<Response<Body>, ApiError> {
    let (opts, dry_run) = delete_options(call)?;
    let list_opts = crate::query::ListOptions::from_query(&call.query)?;
    let selector = super::Selectors::parse::<T>(&list_opts)?;
    let ns = call.route.namespace.clone();
    let prefix = T::INFO.prefix(Some(&ns));
    let range = app
        .store
        .range(KeyRange::prefix(prefix), None, 0)
        .await
        .map_err(respond::store_error)?;
    let pre = opts.preconditions.unwrap_or_default();
    for kv in &range.kvs {
        let obj: T = object::decode_from_store(kv)?;
        if !selector.matches(&obj) {
            continue;
        }
        match delete_one::<T>(
            app,
            &kv.key,
            &obj.meta().name,
            &pre,
            dry_run,
            &call.user,
            call.parts.extensions.get(),
        )
        .await
        {
            Ok(_) | Err(ApiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(respond::json(
        StatusCode::OK,
        &Status::success(None),
        call.query.pretty(),
    ))
}

/// Deletes every object of type `T` in namespace `ns` (the namespace controller's sweep) and
/// returns how many remain.
pub async fn delete_all_in_namespace<T: Kind>(app: &App, ns: &str) -> Result<usize, ApiError> {
    // Who admission sees deleting: the controller, as Kubernetes' namespace controller is.
    let namespace_controller = svc_core::user::UserInfo {
        username: NAMESPACE_CONTROLLER.into(),
        groups: vec![svc_core::user::GROUP_AUTHENTICATED.into()],
        ..Default::default()
    };
    let range = app
        .store
        .range(KeyRange::prefix(T::INFO.prefix(Some(ns))), None, 0)
        .await
        .map_err(respond::store_error)?;
    let prefix_len = T::INFO.prefix(Some(ns)).len();
    for kv in &range.kvs {
        let name =
            String::from_utf8_lossy(kv.key.get(prefix_len..).unwrap_or_default()).to_string();
        let none = Preconditions::default();
        match delete_one::<T>(
            app,
            &kv.key,
            &name,
            &none,
            false,
            &namespace_controller,
            None,
        )
        .await
        {
            Ok(_) | Err(ApiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    // Objects held by their own finalizers are still there; the caller retries later.
    let left = app
        .store
        .range(KeyRange::prefix(T::INFO.prefix(Some(ns))), None, 0)
        .await
        .map_err(respond::store_error)?;
    Ok(left.kvs.len())
}
