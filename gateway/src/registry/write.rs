//! Typed writes over the store: create, the one update sequence that PUT, PATCH and apply
//! share, delete (finalizers, preconditions, the corrupt-object escape) and deletecollection.
//! Each takes decoded objects and returns them; the HTTP handlers decode bodies, call these,
//! and encode the answers. Optimistic concurrency is the store's revision; every write goes
//! through admission (mutating, then validating) and records `managedFields`.

use std::time::Duration;

use bytes::Bytes;
use svc_core::ambient::System;
use svc_core::codec::Preconditions;
use svc_core::kinds::Namespace;
use svc_core::meta::Time;
use svc_core::object::{self, parse_resource_version};
use svc_core::patch::managed::{self, Writer};
use svc_core::registry::Kind;
use svc_core::status::Subject;
use svc_core::user::UserInfo;
use svc_core::{ApiError, Resource};
use svc_storage::{KeyRange, KeyValue, Revision, StoreError};

use crate::base::annotations::Annotations;
use crate::registry::admission::{self, Operation, Outcome};
use crate::registry::errors;
use crate::registry::state::Registry;

/// How often a create retries a `generateName` collision, and an update a concurrent write,
/// before giving up.
const MAX_RETRIES: usize = 8;

/// Who writes, and how: what every typed write needs from its request.
#[derive(Clone, Copy)]
pub struct WriteRequest<'a> {
    pub user: &'a UserInfo,
    /// The subresource written through (`status`, `approval`), if any.
    pub subresource: Option<&'a str>,
    pub dry_run: bool,
    /// The request's audit annotations, when it is audited.
    pub audit: Option<&'a Annotations>,
}

impl<'a> WriteRequest<'a> {
    /// What admission plugins see of this write of `T` to `namespace`/`name`.
    pub fn attributes<T: Resource>(
        &self,
        operation: Operation,
        namespace: &'a str,
        name: &'a str,
    ) -> admission::Attributes<'a> {
        admission::Attributes {
            operation,
            info: T::INFO,
            subresource: self.subresource,
            namespace,
            name,
            user: self.user,
            dry_run: self.dry_run,
            audit: self.audit,
        }
    }
}

/// How a write's `managedFields` are kept.
#[derive(Clone, Copy)]
pub enum Fields<'a> {
    /// Recorded as an `Update` by this field manager (create, PUT, the three patch types).
    Update { manager: &'a str },
    /// Already computed by server-side apply and carried by the object.
    Applied,
}

/// A write that was admitted and stored (or would be, for a dry run).
pub struct Written<T> {
    /// The object as stored, with its new `resourceVersion`.
    pub object: T,
    /// What admission added: warnings and audit annotations.
    pub outcome: Outcome,
}

/// Who writes `T`'s fields now: `manager`, under `api_version` (the kind's).
pub fn writer<'a, T: Kind>(api_version: &'a str, manager: &'a str) -> Writer<'a> {
    Writer {
        kind: T::INFO.strategies(),
        api_version,
        manager,
        now: Time::now(),
    }
}

/// Records a non-apply write in `next`'s `managedFields` as an `Update` by `manager`; `old`
/// is `None` on create.
fn record_update<T: Kind>(manager: &str, old: Option<&T>, next: &mut T) -> Result<(), ApiError> {
    let api_version = T::INFO.api_version();
    let writer = writer::<T>(&api_version, manager);
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
async fn check_namespace_open<T: Kind>(
    registry: &Registry,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    if !T::INFO.namespaced() {
        return Ok(());
    }
    let key = Bytes::from(Namespace::INFO.key("", ns));
    let (kv, _) = registry
        .store
        .get(key, None)
        .await
        .map_err(errors::store_error)?;
    let kv = kv.ok_or_else(|| ApiError::NotFound(Subject::new("", "namespaces", ns)))?;
    let nsobj: Namespace = object::decode_from_store(&kv)?;
    if nsobj.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::Forbidden {
            message: format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} \
                 because it is being terminated",
                T::INFO.plural
            ),
            subject: Some(Subject::new(T::INFO.group, T::INFO.plural, name)),
            causes: vec![svc_core::status::StatusCause {
                reason: "NamespaceTerminating".into(),
                message: format!("namespace {ns} is being terminated"),
                field: "metadata.namespace".into(),
            }],
        });
    }
    Ok(())
}

/// The stored object at `key`, decoded, with its key-value.
pub async fn read_current<T: Resource>(
    registry: &Registry,
    key: &Bytes,
    name: &str,
) -> Result<(T, KeyValue), ApiError> {
    let (kv, _) = registry
        .store
        .get(key.clone(), None)
        .await
        .map_err(errors::store_error)?;
    let kv = kv.ok_or_else(|| ApiError::NotFound(object::subject::<T>(name)))?;
    Ok((object::decode_from_store(&kv)?, kv))
}

/// The time to live a write gives `T`'s objects: `--event-ttl` for kinds that expire, none
/// for the others or when the flag is 0 (as Kubernetes treats `--event-ttl=0`).
fn ttl_of<T: Resource>(registry: &Registry) -> Option<Duration> {
    let ttl = registry.event_ttl;
    (T::INFO.expires && !ttl.is_zero()).then_some(ttl)
}

/// Creates `T`'s object at `key`, expiring if the kind expires.
async fn store_create<T: Resource>(
    registry: &Registry,
    key: Bytes,
    value: Bytes,
) -> Result<KeyValue, StoreError> {
    match ttl_of::<T>(registry) {
        Some(ttl) => registry.store.create_with_ttl(key, value, ttl).await,
        None => registry.store.create(key, value).await,
    }
}

/// Updates `T`'s object at `key` (compare-and-swap on `expected`); an expiring kind's time to
/// live starts again, as Kubernetes gives every event write the full TTL.
async fn store_update<T: Resource>(
    registry: &Registry,
    key: Bytes,
    value: Bytes,
    expected: Revision,
) -> Result<KeyValue, StoreError> {
    match ttl_of::<T>(registry) {
        Some(ttl) => {
            registry
                .store
                .update_with_ttl(key, value, expected, ttl)
                .await
        }
        None => registry.store.update(key, value, expected).await,
    }
}

/// 409 for a write that lost the race for `T`'s object `name`.
pub fn conflict<T: Resource>(name: &str) -> ApiError {
    ApiError::Conflict {
        subject: object::subject::<T>(name),
        message: "the object has been modified; please apply your changes to the latest version \
                  and try again"
            .into(),
    }
}

/// A failed write of `T`'s object `name` as the client sees it.
pub fn map_write_error<T: Resource>(e: StoreError, name: &str) -> ApiError {
    match e {
        StoreError::AlreadyExists { .. } => ApiError::AlreadyExists(object::subject::<T>(name)),
        StoreError::Conflict { .. } => conflict::<T>(name),
        StoreError::NotFound => ApiError::NotFound(object::subject::<T>(name)),
        other => errors::store_error(other),
    }
}

/// Creates `obj` in `ns`: mutating admission, the create defaults and validation, the
/// namespace check, validating admission, then the store (a `generateName` collision tries
/// another name). A dry run stops before the store and answers what it would store.
pub async fn create<T: Kind>(
    registry: &Registry,
    req: &WriteRequest<'_>,
    ns: &str,
    mut obj: T,
    fields: Fields<'_>,
) -> Result<Written<T>, ApiError> {
    object::apply_request_namespace(&mut obj, ns)?;
    let mut outcome = Outcome::default();
    if !registry.admission.is_empty() {
        let name = obj.meta().name.clone();
        let attrs = req.attributes::<T>(Operation::Create, ns, &name);
        registry
            .admission
            .mutate(&attrs, &mut obj, None, &mut outcome)
            .await?;
        // A plugin may not move the object to another namespace than the path's.
        object::apply_request_namespace(&mut obj, ns)?;
    }
    let ns = obj.meta().namespace.clone();
    let generated = obj.meta().name.is_empty() && !obj.meta().generate_name.is_empty();
    for _ in 0..MAX_RETRIES {
        let mut candidate = obj.clone();
        match fields {
            Fields::Update { manager } => {
                object::prepare_create_by(&mut candidate, req.user, &System, &registry.validator)?;
                record_update(manager, None, &mut candidate)?;
            }
            Fields::Applied => {
                let applied = candidate.meta().managed_fields.clone();
                object::prepare_create_by(&mut candidate, req.user, &System, &registry.validator)?;
                candidate.meta_mut().managed_fields = applied;
            }
        }
        let name = candidate.meta().name.clone();
        check_namespace_open::<T>(registry, &ns, &name).await?;
        let attrs = req.attributes::<T>(Operation::Create, &ns, &name);
        registry
            .admission
            .validate(&attrs, Some(&candidate), None, &mut outcome)
            .await?;
        let key = Bytes::from(T::INFO.key(&ns, &name));
        if req.dry_run {
            let (existing, _) = registry
                .store
                .get(key, None)
                .await
                .map_err(errors::store_error)?;
            match existing {
                Some(_) if generated => continue,
                Some(_) => return Err(ApiError::AlreadyExists(object::subject::<T>(&name))),
                None => {
                    return Ok(Written {
                        object: candidate,
                        outcome,
                    });
                }
            }
        }
        let value = Bytes::from(object::encode_for_store(&candidate)?);
        match store_create::<T>(registry, key, value).await {
            Ok(kv) => {
                candidate.meta_mut().resource_version = kv.mod_revision.to_string();
                return Ok(Written {
                    object: candidate,
                    outcome,
                });
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

/// An update's new object made from the stored one: PUT's body as sent, a patch applied to
/// it, or an apply configuration merged into it; with the warnings making it produced
/// (unknown fields under `fieldValidation=Warn`). Called again after a concurrent write.
pub type Change<'c, T> = dyn FnMut(&T) -> Result<(T, Vec<String>), ApiError> + Send + 'c;

/// An update that was stored, with the warnings of the change that made it.
pub struct Updated<T> {
    pub written: Written<T>,
    pub warnings: Vec<String>,
}

/// The one update sequence of PUT, PATCH and apply: read the stored object, make the new one
/// (`change`), check a `resourceVersion` precondition and the name, run mutating admission,
/// the update rules and validation, record `managedFields`, run validating admission, and
/// commit on the revision read. A concurrent write starts it again from the newer object,
/// where a precondition then fails with 409. A missing object is `NotFound`: whether that
/// creates is the caller's to decide.
pub async fn update<T: Kind>(
    registry: &Registry,
    req: &WriteRequest<'_>,
    ns: &str,
    name: &str,
    change: &mut Change<'_, T>,
    fields: Fields<'_>,
) -> Result<Updated<T>, ApiError> {
    let key = Bytes::from(T::INFO.key(ns, name));
    for _ in 0..MAX_RETRIES {
        let (current, kv) = read_current::<T>(registry, &key, name).await?;
        let (mut next, warnings) = change(&current)?;
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
        object::apply_request_namespace(&mut next, ns)?;
        let mut outcome = Outcome::default();
        let attrs = req.attributes::<T>(Operation::Update, ns, name);
        registry
            .admission
            .mutate(&attrs, &mut next, Some(&current), &mut outcome)
            .await?;
        object::prepare_update_via(
            &mut next,
            &current,
            req.subresource,
            &System,
            &registry.validator,
        )?;
        if let Fields::Update { manager } = fields {
            record_update(manager, Some(&current), &mut next)?;
        }
        registry
            .admission
            .validate(&attrs, Some(&next), Some(&current), &mut outcome)
            .await?;
        match commit_update(registry, &key, &kv, current, next, req.dry_run, name).await? {
            Committed::Done(object) => {
                return Ok(Updated {
                    written: Written { object, outcome },
                    warnings,
                });
            }
            Committed::Stale => continue,
        }
    }
    Err(conflict::<T>(name))
}

/// What committing a prepared update did.
enum Committed<T> {
    /// The object as stored now (unchanged, written, deleted, or as a dry run would store it).
    Done(T),
    /// Another write got in since `kv` was read: read again and retry.
    Stale,
}

/// Commits `next` over the stored `current` (read as `kv`), the last step of every update:
/// nothing when nothing changed (no new resourceVersion, no watch event), nothing for a dry
/// run, the deletion when the last finalizer of a terminating object is gone, and otherwise
/// a compare-and-swap write on `kv`'s revision.
async fn commit_update<T: Kind>(
    registry: &Registry,
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
        registry
            .store
            .delete(key.clone(), Some(kv.mod_revision))
            .await
            .map(|(_, rev)| rev)
    } else {
        store_update::<T>(registry, key.clone(), Bytes::from(value), kv.mod_revision)
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

/// What a delete did to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// Removed from the store (or would be, for a dry run).
    Removed,
    /// Finalizers hold it: marked terminating now.
    Terminating,
    /// Finalizers hold it and it was already terminating (or a dry run would mark it).
    Finalizing,
}

/// Deletes `T`'s object `name` in `ns`, or marks it terminating when finalizers hold it.
/// Returns the object as the client sees it: the deleted one, or the terminating one.
/// Validating admission sees the stored object first (deletes have no mutating phase).
pub async fn delete<T: Kind>(
    registry: &Registry,
    req: &WriteRequest<'_>,
    ns: &str,
    name: &str,
    pre: &Preconditions,
) -> Result<(T, Deletion), ApiError> {
    let key = Bytes::from(T::INFO.key(ns, name));
    for _ in 0..MAX_RETRIES {
        let (mut current, kv) = read_current::<T>(registry, &key, name).await?;
        check_preconditions::<T>(&current, pre, name)?;
        if !registry.admission.is_empty() {
            let ns = current.meta().namespace.clone();
            let attrs = req.attributes::<T>(Operation::Delete, &ns, name);
            registry
                .admission
                .validate::<T>(&attrs, None, Some(&current), &mut Outcome::default())
                .await?;
        }
        if !current.meta().finalizers.is_empty() || current.has_kind_finalizers() {
            if current.meta().deletion_timestamp.is_some() {
                return Ok((current, Deletion::Finalizing));
            }
            current.meta_mut().deletion_timestamp = Some(Time::now());
            // Kubernetes' namespace registry deletes without a grace period; every other
            // kind's terminating object says 0.
            if T::INFO.kind != Namespace::INFO.kind {
                current.meta_mut().deletion_grace_period_seconds = Some(0);
            }
            current.mark_terminating();
            if req.dry_run {
                return Ok((current, Deletion::Finalizing));
            }
            let value = Bytes::from(object::encode_for_store(&current)?);
            match store_update::<T>(registry, key.clone(), value, kv.mod_revision).await {
                Ok(new_kv) => {
                    current.meta_mut().resource_version = new_kv.mod_revision.to_string();
                    if T::INFO.kind == Namespace::INFO.kind {
                        registry.namespace_changed.notify_one();
                    }
                    return Ok((current, Deletion::Terminating));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(map_write_error::<T>(e, name)),
            }
        }
        if req.dry_run {
            return Ok((current, Deletion::Removed));
        }
        match registry
            .store
            .delete(key.clone(), Some(kv.mod_revision))
            .await
        {
            Ok(_) => return Ok((current, Deletion::Removed)),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(map_write_error::<T>(e, name)),
        }
    }
    Err(conflict::<T>(name))
}

/// A delete's `uid` and `resourceVersion` preconditions against the stored object.
fn check_preconditions<T: Resource>(
    current: &T,
    pre: &Preconditions,
    name: &str,
) -> Result<(), ApiError> {
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
    Ok(())
}

/// Deletes every object of `T` in `ns` that `selects` picks (the request's label and field
/// selectors), each as [`delete`] does; one already gone is skipped.
pub async fn delete_collection<T: Kind>(
    registry: &Registry,
    req: &WriteRequest<'_>,
    ns: &str,
    selects: impl Fn(&T) -> bool,
    pre: &Preconditions,
) -> Result<(), ApiError> {
    let range = registry
        .store
        .range(KeyRange::prefix(T::INFO.prefix(Some(ns))), None, 0)
        .await
        .map_err(errors::store_error)?;
    for kv in &range.kvs {
        let obj: T = object::decode_from_store(kv)?;
        if !selects(&obj) {
            continue;
        }
        let meta = obj.meta();
        match delete::<T>(registry, req, &meta.namespace, &meta.name, pre).await {
            Ok(_) | Err(ApiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `T`'s record at `ns`/`name` cannot be read or decoded (a corrupt object).
pub async fn is_corrupt<T: Kind>(registry: &Registry, ns: &str, name: &str) -> bool {
    let key = Bytes::from(T::INFO.key(ns, name));
    match registry.store.get(key, None).await {
        Err(StoreError::Corrupt { .. }) => true,
        Ok((Some(kv), _)) => object::decode_from_store::<T>(&kv).is_err(),
        _ => false,
    }
}

/// Removes `T`'s record at `ns`/`name` unconditionally, ignoring finalizers and
/// preconditions: the alpha force deletion of an object that cannot be read.
pub async fn delete_unreadable<T: Kind>(
    registry: &Registry,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    let key = Bytes::from(T::INFO.key(ns, name));
    registry
        .store
        .delete(key, None)
        .await
        .map(|_| ())
        .map_err(|e| map_write_error::<T>(e, name))
}
