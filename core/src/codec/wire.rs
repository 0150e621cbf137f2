//! Protobuf messages wire-compatible with Kubernetes' `generated.proto`, for the types we serve.
//!
//! Hand-written with `prost` derive instead of depending on the `k8s-pb` crate: we need about
//! twenty of its ~1,500 messages, and it cost 30 s to build and 11 s to check on this 2-core
//! machine (100 MB rlib), paid again on every clean CI run. The tag numbers below were copied
//! from `k8s.io/apimachinery/pkg/runtime/generated.proto`,
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto` and `k8s.io/api/core/v1/generated.proto`
//! and cross-checked field by field against `k8s-pb` 0.9.0's generated code; the golden tests
//! in `tests.rs` pin the bytes.
//!
//! Presence follows the Go types, not the `.proto` (which marks everything `optional`): a Go
//! pointer field (`*int64`, `*bool`, `*string`, `*Time`) is `optional` here so `Some(0)` and
//! `Some(false)` survive; a Go value field (`string`, `int64`) is a plain scalar, because Go
//! cannot tell its zero value from unset either.

use std::collections::BTreeMap;

// ---- k8s.io.apimachinery.pkg.runtime ----

/// `runtime.TypeMeta`. Note the order differs from `meta.v1.TypeMeta` (kind=1, apiVersion=2);
/// the envelope uses this one.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TypeMeta {
    #[prost(string, tag = "1")]
    pub api_version: String,
    #[prost(string, tag = "2")]
    pub kind: String,
}

/// `runtime.Unknown`: the envelope after the `k8s\0` prefix.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", tag = "2")]
    pub raw: Vec<u8>,
    #[prost(string, tag = "3")]
    pub content_encoding: String,
    #[prost(string, tag = "4")]
    pub content_type: String,
}

/// `runtime.RawExtension`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RawExtension {
    #[prost(bytes = "vec", tag = "1")]
    pub raw: Vec<u8>,
}

// ---- k8s.io.apimachinery.pkg.apis.meta.v1 ----

/// `meta.v1.Time` (and `Timestamp`). Go writes a zero time as an empty message and reads an
/// empty message back as zero time, so presence of `seconds` is what tells "unset" apart from
/// the epoch.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Time {
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

/// `meta.v1.FieldsV1`: `Raw` holds the managed-fields trie as JSON bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct FieldsV1 {
    #[prost(bytes = "vec", tag = "1")]
    pub raw: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ManagedFieldsEntry {
    #[prost(string, tag = "1")]
    pub manager: String,
    #[prost(string, tag = "2")]
    pub operation: String,
    #[prost(string, tag = "3")]
    pub api_version: String,
    #[prost(message, optional, tag = "4")]
    pub time: Option<Time>,
    // Tag 5 was the alpha `fields` (message `Fields`), replaced by 6 and 7.
    #[prost(string, tag = "6")]
    pub fields_type: String,
    #[prost(message, optional, tag = "7")]
    pub fields_v1: Option<FieldsV1>,
    #[prost(string, tag = "8")]
    pub subresource: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct OwnerReference {
    #[prost(string, tag = "1")]
    pub kind: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub uid: String,
    #[prost(string, tag = "5")]
    pub api_version: String,
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ObjectMeta {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub generate_name: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(string, tag = "4")]
    pub self_link: String,
    #[prost(string, tag = "5")]
    pub uid: String,
    #[prost(string, tag = "6")]
    pub resource_version: String,
    #[prost(int64, tag = "7")]
    pub generation: i64,
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
    // Tags 15 (`clusterName`) and 16 (`initializers`) belonged to fields Kubernetes removed.
    #[prost(message, repeated, tag = "17")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListMeta {
    #[prost(string, tag = "1")]
    pub self_link: String,
    #[prost(string, tag = "2")]
    pub resource_version: String,
    #[prost(string, tag = "3")]
    pub continue_: String,
    #[prost(int64, optional, tag = "4")]
    pub remaining_item_count: Option<i64>,
}

/// Any `*List` kind: every Kubernetes list message is `metadata = 1`, `items = 2`. Items are
/// carried as already-encoded object messages; a repeated `bytes` field and a repeated
/// embedded message are the same bytes on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RawList {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub items: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusCause {
    /// Go's `Type`, JSON `reason`.
    #[prost(string, tag = "1")]
    pub reason: String,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(string, tag = "3")]
    pub field: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusDetails {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub group: String,
    #[prost(string, tag = "3")]
    pub kind: String,
    #[prost(message, repeated, tag = "4")]
    pub causes: Vec<StatusCause>,
    #[prost(int32, tag = "5")]
    pub retry_after_seconds: i32,
    #[prost(string, tag = "6")]
    pub uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Status {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(string, tag = "2")]
    pub status: String,
    #[prost(string, tag = "3")]
    pub message: String,
    #[prost(string, tag = "4")]
    pub reason: String,
    #[prost(message, optional, tag = "5")]
    pub details: Option<StatusDetails>,
    #[prost(int32, tag = "6")]
    pub code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Preconditions {
    #[prost(string, optional, tag = "1")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeleteOptions {
    #[prost(int64, optional, tag = "1")]
    pub grace_period_seconds: Option<i64>,
    #[prost(message, optional, tag = "2")]
    pub preconditions: Option<Preconditions>,
    #[prost(bool, optional, tag = "3")]
    pub orphan_dependents: Option<bool>,
    #[prost(string, optional, tag = "4")]
    pub propagation_policy: Option<String>,
    #[prost(string, repeated, tag = "5")]
    pub dry_run: Vec<String>,
    #[prost(bool, optional, tag = "6")]
    pub ignore_store_read_error_with_cluster_breaking_potential: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WatchEvent {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(message, optional, tag = "2")]
    pub object: Option<RawExtension>,
}
