//! `CachedObject`, the one form objects take inside the watch cache, `KindCodec`, the per-type
//! functions that produce and re-encode it, and `Selector`, label and field selectors matched
//! against it. Everything here is non-generic so the cache itself is written once.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use svc_storage::{KeyValue, Revision};

use crate::codec::ProtoKind;
use crate::object::decode_from_store;
use crate::resource::{Resource, ResourceInfo, field_value};
use crate::selector::{FieldSelector, LabelSelector, Labels};
use crate::status::ApiError;

/// One object as the cache holds it: what filtering needs, decoded once at ingest, plus the
/// canonical JSON (with `resourceVersion` set) that lists and watch frames reuse verbatim.
pub struct CachedObject {
    /// The store key (`/registry/<plural>/[<namespace>/]<name>`).
    pub key: Bytes,
    /// Empty for cluster-scoped objects.
    pub namespace: Box<str>,
    pub name: Box<str>,
    pub labels: Labels,
    /// Values of the type's extra field selectors (`ResourceInfo::extra_fields`).
    pub fields: Vec<(&'static str, String)>,
    /// The store revision of the last write, which is also `metadata.resourceVersion`.
    pub resource_version: Revision,
    /// The object's JSON, `resourceVersion` included, exactly as served.
    pub json: Bytes,
    /// The bare protobuf message, encoded on first use and shared by lists and frames.
    /// Errors are kept as text so the cell stays small and the failure is reported each time.
    protobuf: OnceLock<Result<Bytes, Arc<str>>>,
}

impl CachedObject {
    pub fn new(
        key: Bytes,
        namespace: &str,
        name: &str,
        labels: BTreeMap<String, String>,
        fields: Vec<(&'static str, String)>,
        resource_version: Revision,
        json: Bytes,
    ) -> Self {
        CachedObject {
            key,
            namespace: namespace.into(),
            name: name.into(),
            labels: labels.into(),
            fields,
            resource_version,
            json,
            protobuf: OnceLock::new(),
        }
    }

    /// The same object with other JSON and version (a deleted object re-stamped with the
    /// revision of its delete); labels and fields are unchanged by construction.
    pub(crate) fn with_json(&self, json: Bytes, resource_version: Revision) -> Self {
        CachedObject {
            key: self.key.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            labels: self.labels.clone(),
            fields: self.fields.clone(),
            resource_version,
            json,
            protobuf: OnceLock::new(),
        }
    }

    /// The value of a field selector's field, without allocating.
    pub fn field(&self, field: &str) -> Option<&str> {
        match field {
            "metadata.name" => Some(&self.name),
            "metadata.namespace" => Some(&self.namespace),
            _ => self
                .fields
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v.as_str()),
        }
    }

    /// The bare protobuf message of the object, encoded once (`encode_list_protobuf_raw` and
    /// watch frames take it as is). Fails if the type has no protobuf encoder.
    pub fn protobuf(&self, codec: &KindCodec) -> Result<Bytes, ApiError> {
        let cell = self.protobuf.get_or_init(|| match codec.protobuf {
            Some(encode) => encode(&self.json)
                .map(Bytes::from)
                .map_err(|e| Arc::from(e.to_string())),
            None => Err(Arc::from(format!(
                "{} has no protobuf encoding",
                codec.info.kind
            ))),
        });
        cell.clone().map_err(|m| ApiError::Internal(m.to_string()))
    }

    /// Bytes this object keeps alive, for the history ring's byte bound. An estimate: map
    /// and allocator overheads are approximated, the large parts (JSON, key) are exact.
    pub fn heap_size(&self) -> usize {
        let labels: usize = self
            .labels
            .iter()
            .map(|(k, v)| k.len().saturating_add(v.len()).saturating_add(48))
            .sum();
        let fields: usize = self
            .fields
            .iter()
            .map(|(_, v)| v.len().saturating_add(40))
            .sum();
        let protobuf = self
            .protobuf
            .get()
            .and_then(|r| r.as_ref().ok())
            .map_or(0, Bytes::len);
        [
            self.key.len(),
            self.namespace.len(),
            self.name.len(),
            self.json.len(),
            labels,
            fields,
            protobuf,
        ]
        .into_iter()
        .fold(std::mem::size_of::<Self>(), usize::saturating_add)
    }
}

impl fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedObject")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("resource_version", &self.resource_version)
            .field("labels", &self.labels)
            .field("json_len", &self.json.len())
            .finish_non_exhaustive()
    }
}

/// Decodes a stored key-value of type `T` into a [`CachedObject`]: the cache's per-type
/// "ingest" function. One typed decode and one encode per write, paid once at ingest.
pub fn ingest<T: Resource>(kv: &KeyValue) -> Result<CachedObject, ApiError> {
    let obj: T = decode_from_store(kv)?;
    let mut json = serde_json::to_vec(&obj).map_err(ApiError::internal)?;
    // Kept for the object's life: without this, the room serde_json's doubling left (up to
    // the JSON's own length again) stays allocated with it.
    json.shrink_to_fit();
    let fields = T::INFO
        .extra_fields
        .iter()
        .map(|f| (*f, field_value(&obj, f).unwrap_or_default()))
        .collect();
    let meta = obj.meta();
    Ok(CachedObject::new(
        kv.key.clone(),
        &meta.namespace,
        &meta.name,
        meta.labels.clone(),
        fields,
        kv.mod_revision,
        Bytes::from(json),
    ))
}

/// Re-encodes an object's JSON with another `resourceVersion` (a `DELETED` event carries the
/// deleted object at the revision of the delete, as Kubernetes sends it).
pub fn restamp<T: Resource>(json: &[u8], revision: Revision) -> Result<Vec<u8>, ApiError> {
    let mut obj: T = serde_json::from_slice(json).map_err(ApiError::internal)?;
    obj.meta_mut().resource_version = revision.to_string();
    let mut json = serde_json::to_vec(&obj).map_err(ApiError::internal)?;
    json.shrink_to_fit();
    Ok(json)
}

/// The bare protobuf message of an object given as (canonical or bookmark) JSON.
pub fn protobuf_from_json<T: Resource + ProtoKind>(json: &[u8]) -> Result<Vec<u8>, ApiError> {
    let obj: T = serde_json::from_slice(json).map_err(ApiError::internal)?;
    Ok(obj.to_proto_bytes())
}

/// Encodes an object's JSON as its bare protobuf message.
pub type ProtobufFn = fn(&[u8]) -> Result<Vec<u8>, ApiError>;

/// The per-type functions the cache calls, so that the cache itself is not generic: a typed
/// decode at ingest, a typed re-encode for deleted objects, and (optionally) the protobuf
/// encoder. Protobuf goes through the canonical JSON rather than a kept typed value, so the
/// cache holds one form per object and pays the protobuf cost only when a protobuf client
/// exists, once per object (cached in the object) and once per event frame.
#[derive(Clone, Copy)]
pub struct KindCodec {
    pub info: &'static ResourceInfo,
    pub ingest: fn(&KeyValue) -> Result<CachedObject, ApiError>,
    pub restamp: fn(&[u8], Revision) -> Result<Vec<u8>, ApiError>,
    /// Bare protobuf message from JSON; `None` for types served only as JSON.
    pub protobuf: Option<ProtobufFn>,
    /// Whether a list's items keep `apiVersion` and `kind`: Kubernetes clears them from the
    /// items of its built-in kinds' lists and keeps them in custom resources' (unstructured).
    pub list_item_types: bool,
}

impl KindCodec {
    /// A JSON-only codec for `T`.
    pub fn json<T: Resource>() -> Self {
        KindCodec {
            info: T::INFO,
            ingest: ingest::<T>,
            restamp: restamp::<T>,
            protobuf: None,
            list_item_types: false,
        }
    }

    /// A codec for `T` that can also produce protobuf frames.
    pub fn with_protobuf<T: Resource + ProtoKind>() -> Self {
        KindCodec {
            protobuf: Some(protobuf_from_json::<T>),
            ..Self::json::<T>()
        }
    }
}

impl fmt::Debug for KindCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KindCodec")
            .field("kind", &self.info.kind)
            .field("protobuf", &self.protobuf.is_some())
            .finish()
    }
}

/// A list or watch request's label and field selectors, matched against cached objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selector {
    pub fn new(labels: LabelSelector, fields: FieldSelector) -> Self {
        Selector { labels, fields }
    }

    /// The selector that matches every object.
    pub fn everything() -> Self {
        Selector::default()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether `obj` matches both selectors. Field terms are compared in place (no
    /// allocation): this runs once per candidate watcher per event.
    pub fn matches(&self, obj: &CachedObject) -> bool {
        self.labels.matches(&obj.labels)
            && self
                .fields
                .terms
                .iter()
                .all(|t| (obj.field(&t.field).unwrap_or("") == t.value) != t.negated)
    }
}
