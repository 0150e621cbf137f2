//! The generic object pipeline shared by every kind: decoding request bodies, the metadata
//! rules of create and update (generateName, uid, creationTimestamp, namespaces), and the
//! stored form (an object without `resourceVersion`, which comes from the store revision).

use svc_storage::KeyValue;

use crate::ambient::Ambient;
use crate::resource::Resource;
use crate::status::{ApiError, Subject};
use crate::user::UserInfo;
use crate::validation::declarative::Validator;
use crate::validation::{self, ErrorList};

/// Decodes a JSON request body into `T`, checking that `apiVersion`/`kind`, when present,
/// name this type. Missing ones are filled in, as the endpoint already says which type it is.
pub fn decode_json<T: Resource>(body: &[u8]) -> Result<T, ApiError> {
    let mut obj: T = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding {} body: {e}", T::INFO.kind)))?;
    check_type_meta(&obj)?;
    obj.set_type_meta();
    Ok(obj)
}

/// Rejects an object whose `apiVersion` or `kind` names another type.
pub fn check_type_meta<T: Resource>(obj: &T) -> Result<(), ApiError> {
    let (api_version, kind) = obj.type_meta();
    check_type_header::<T>(api_version, kind)
}

/// Rejects an `apiVersion`/`kind` pair (from a body or an envelope) naming another type;
/// empty ones are allowed, as the endpoint already says which type it is.
pub fn check_type_header<T: Resource>(api_version: &str, kind: &str) -> Result<(), ApiError> {
    let info = T::INFO;
    if !kind.is_empty() && kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the expected kind ({})",
            info.kind
        )));
    }
    if !api_version.is_empty() && api_version != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API \
             version ({})",
            info.api_version()
        )));
    }
    Ok(())
}

/// Reconciles the body's namespace with the path's: empty takes the path's, a different one
/// is refused, and cluster-scoped objects may carry none.
pub fn apply_request_namespace<T: Resource>(obj: &mut T, path_ns: &str) -> Result<(), ApiError> {
    let meta = obj.meta_mut();
    if T::INFO.namespaced() {
        if meta.namespace.is_empty() {
            meta.namespace = path_ns.to_string();
        } else if meta.namespace != path_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the \
                 request",
            ));
        }
    } else {
        meta.namespace.clear();
    }
    Ok(())
}

fn invalid<T: Resource>(obj: &T, errs: ErrorList) -> ApiError {
    ApiError::Invalid {
        kind: T::INFO.kind.into(),
        group: T::INFO.group.into(),
        name: obj.meta().name.clone(),
        causes: errs.0,
    }
}

/// Everything a create does to an object before it is stored: server-set metadata, defaulting,
/// validation (hand-written, and declarative as `validator` says). `generateName` is resolved
/// here; on a name collision the caller calls again. This is a create made by the server
/// itself, with no requester to record. The uid, creation time and generated name come from
/// `ambient`.
pub fn prepare_create<T: Resource>(
    obj: &mut T,
    ambient: &dyn Ambient,
    validator: &Validator,
) -> Result<(), ApiError> {
    prepare_create_by(obj, &UserInfo::default(), ambient, validator)
}

/// `prepare_create` for a request made by `user`, whom kinds that record their requester
/// (`Resource::prepare_for_create_by`) remember.
pub fn prepare_create_by<T: Resource>(
    obj: &mut T,
    user: &UserInfo,
    ambient: &dyn Ambient,
    validator: &Validator,
) -> Result<(), ApiError> {
    let meta = obj.meta_mut();
    if meta.name.is_empty() && !meta.generate_name.is_empty() {
        meta.name = validation::generate_name(&meta.generate_name, ambient);
    }
    meta.uid = ambient.new_uid();
    meta.creation_timestamp = Some(ambient.now());
    meta.resource_version.clear();
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.self_link.clear();
    obj.prepare_for_create();
    obj.prepare_for_create_by(user);
    let mut errs =
        validation::validate_object_meta(obj.meta(), T::INFO.namespaced(), T::INFO.name_rule);
    errs.extend(obj.validate());
    answer(obj, validator.validate(obj, None, errs))
}

fn answer<T: Resource>(obj: &T, errs: ErrorList) -> Result<(), ApiError> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(invalid(obj, errs))
    }
}

/// Everything an update does: keeps what the server owns from `old`, validates immutability
/// and the object (hand-written, and declarative as `validator` says).
pub fn prepare_update<T: Resource>(
    obj: &mut T,
    old: &T,
    validator: &Validator,
) -> Result<(), ApiError> {
    let mut errs = validation::validate_object_meta_update(obj.meta(), old.meta());
    let old_meta = old.meta();
    let meta = obj.meta_mut();
    meta.uid = old_meta.uid.clone();
    meta.creation_timestamp = old_meta.creation_timestamp;
    meta.deletion_timestamp = old_meta.deletion_timestamp;
    meta.deletion_grace_period_seconds = old_meta.deletion_grace_period_seconds;
    meta.generate_name = old_meta.generate_name.clone();
    // A request cannot set the generation; a kind's update may move it on.
    meta.generation = old_meta.generation;
    meta.self_link.clear();
    obj.prepare_for_update(old);
    errs.extend(validation::validate_object_meta(
        obj.meta(),
        T::INFO.namespaced(),
        T::INFO.name_rule,
    ));
    errs.extend(obj.validate_update(old));
    answer(obj, validator.validate(obj, Some(old), errs))
}

/// Prepares an update made through `subresource` (`status`, `approval`), or of the object
/// itself when `None`. Through a subresource only that part changes: metadata stays as
/// stored (Kubernetes' `ResetObjectMetaForStatus`), the kind keeps from `obj` only what the
/// subresource owns, and the kind's subresource validation applies. Times a subresource
/// write records (CertificateSigningRequest's conditions) are `ambient`'s.
pub fn prepare_update_via<T: Resource>(
    obj: &mut T,
    old: &T,
    subresource: Option<&str>,
    ambient: &dyn Ambient,
    validator: &Validator,
) -> Result<(), ApiError> {
    let Some(sub) = subresource else {
        return prepare_update(obj, old, validator);
    };
    let resource_version = std::mem::take(&mut obj.meta_mut().resource_version);
    let managed_fields = std::mem::take(&mut obj.meta_mut().managed_fields);
    *obj.meta_mut() = old.meta().clone();
    obj.meta_mut().resource_version = resource_version;
    obj.meta_mut().managed_fields = managed_fields;
    obj.prepare_for_subresource_update(sub, old, ambient.now())?;
    // The subresource's own rules first (what it may change), then the object as a whole.
    answer(obj, obj.validate_subresource_update(sub, old))?;
    let mut errs =
        validation::validate_object_meta(obj.meta(), T::INFO.namespaced(), T::INFO.name_rule);
    errs.extend(obj.validate());
    answer(obj, validator.validate(obj, Some(old), errs))
}

/// The bytes stored for an object: its JSON without `resourceVersion` (the store revision is
/// the version; storing it too would let the two disagree).
pub fn encode_for_store<T: Resource>(obj: &T) -> Result<Vec<u8>, ApiError> {
    if obj.meta().resource_version.is_empty() {
        return serde_json::to_vec(obj).map_err(ApiError::internal);
    }
    let mut copy = obj.clone();
    copy.meta_mut().resource_version.clear();
    serde_json::to_vec(&copy).map_err(ApiError::internal)
}

/// Decodes a stored key-value into an object whose `resourceVersion` is its mod revision.
/// An undecodable record is reported as an internal error naming the key, never served.
pub fn decode_from_store<T: Resource>(kv: &KeyValue) -> Result<T, ApiError> {
    let mut obj: T = serde_json::from_slice(&kv.value).map_err(|e| {
        ApiError::Internal(format!(
            "object stored at {} cannot be decoded: {e}",
            String::from_utf8_lossy(&kv.key)
        ))
    })?;
    obj.set_type_meta();
    obj.meta_mut().resource_version = kv.mod_revision.to_string();
    Ok(obj)
}

/// The `Subject` of errors about `name` of type `T`.
pub fn subject<T: Resource>(name: &str) -> Subject {
    Subject::new(T::INFO.group, T::INFO.plural, name)
}

/// Parses a `resourceVersion` a client sent back; they are opaque, but ours are revisions.
pub fn parse_resource_version(rv: &str) -> Result<i64, ApiError> {
    rv.parse::<i64>()
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid resource version: {rv:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ambient::{Fixed, System};
    use crate::kinds::{Namespace, ServiceAccount};
    use bytes::Bytes;

    #[test]
    fn decode_checks_the_type() {
        let sa: ServiceAccount = decode_json(br#"{"metadata":{"name":"a"}}"#).unwrap();
        assert_eq!(
            (sa.api_version.as_str(), sa.kind.as_str()),
            ("v1", "ServiceAccount")
        );
        let wrong = decode_json::<ServiceAccount>(br#"{"kind":"Namespace","metadata":{}}"#);
        assert_eq!(wrong.unwrap_err().code(), 400);
        let wrong_v = decode_json::<ServiceAccount>(br#"{"apiVersion":"v2","metadata":{}}"#);
        assert!(wrong_v.unwrap_err().to_string().contains("API version"));
        assert_eq!(
            decode_json::<ServiceAccount>(b"{not json")
                .unwrap_err()
                .code(),
            400
        );
        assert_eq!(
            decode_json::<ServiceAccount>(br#"{"secrets":"x"}"#)
                .unwrap_err()
                .code(),
            400
        );
    }

    #[test]
    fn create_sets_server_fields_and_validates() {
        let mut sa: ServiceAccount =
            decode_json(br#"{"metadata":{"generateName":"build-","resourceVersion":"5"}}"#)
                .unwrap();
        apply_request_namespace(&mut sa, "ci").unwrap();
        prepare_create(&mut sa, &System, &Validator::default()).unwrap();
        assert!(sa.metadata.name.starts_with("build-"));
        assert_eq!(sa.metadata.namespace, "ci");
        assert_eq!(sa.metadata.uid.len(), 36);
        assert!(sa.metadata.creation_timestamp.is_some());
        assert!(sa.metadata.resource_version.is_empty());

        let mut bad: Namespace = decode_json(br#"{"metadata":{"name":"No"}}"#).unwrap();
        let e = prepare_create(&mut bad, &System, &Validator::default()).unwrap_err();
        assert_eq!(e.code(), 422);
        let mut other: ServiceAccount =
            decode_json(br#"{"metadata":{"name":"a","namespace":"x"}}"#).unwrap();
        assert_eq!(
            apply_request_namespace(&mut other, "y").unwrap_err().code(),
            400
        );
    }

    #[test]
    fn a_fixed_ambient_makes_creates_deterministic() {
        let at: crate::meta::Time =
            serde_json::from_value(serde_json::json!("2024-05-06T07:08:09Z")).unwrap();
        let create = || {
            let ambient = Fixed::new(at);
            let mut sa: ServiceAccount =
                decode_json(br#"{"metadata":{"generateName":"build-","namespace":"ci"}}"#).unwrap();
            prepare_create(&mut sa, &ambient, &Validator::default()).unwrap();
            serde_json::to_value(&sa).unwrap()
        };
        let first = create();
        assert_eq!(first, create());
        assert_eq!(
            first["metadata"]["creationTimestamp"],
            "2024-05-06T07:08:09Z"
        );
        assert_eq!(first["metadata"]["name"], "build-bbbbb");
        assert_eq!(
            first["metadata"]["uid"],
            "00000000-0000-4000-8000-000000000001"
        );
    }

    #[test]
    fn update_keeps_server_fields() {
        let mut old: Namespace = decode_json(br#"{"metadata":{"name":"a"}}"#).unwrap();
        prepare_create(&mut old, &System, &Validator::default()).unwrap();
        let mut new: Namespace = decode_json(
            br#"{"metadata":{"name":"a","labels":{"x":"y"}},"status":{"phase":"Gone"}}"#,
        )
        .unwrap();
        prepare_update(&mut new, &old, &Validator::default()).unwrap();
        assert_eq!(new.metadata.uid, old.metadata.uid);
        assert_eq!(new.status.phase, "Active");
        let mut renamed: Namespace = decode_json(br#"{"metadata":{"name":"b"}}"#).unwrap();
        assert_eq!(
            prepare_update(&mut renamed, &old, &Validator::default())
                .unwrap_err()
                .code(),
            422
        );
    }

    #[test]
    fn store_round_trip_takes_version_from_revision() {
        let mut sa: ServiceAccount =
            decode_json(br#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"9"}}"#)
                .unwrap();
        sa.automount_service_account_token = Some(false);
        let bytes = encode_for_store(&sa).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("resourceVersion"));
        let kv = KeyValue {
            key: Bytes::from_static(b"/registry/serviceaccounts/n/a"),
            value: Bytes::from(bytes),
            create_revision: 3,
            mod_revision: 42,
            version: 2,
        };
        let back: ServiceAccount = decode_from_store(&kv).unwrap();
        assert_eq!(back.metadata.resource_version, "42");
        assert_eq!(back.automount_service_account_token, Some(false));
        let corrupt = KeyValue {
            value: Bytes::from_static(b"\xff"),
            ..kv
        };
        let e = decode_from_store::<ServiceAccount>(&corrupt).unwrap_err();
        assert!(e.to_string().contains("/registry/serviceaccounts/n/a"));
    }
}
