//! Objects of kinds this server does not compile in (proxy mode's mirrored resources: pods,
//! nodes, custom resources): a [`KindCodec`] that reads what the cache needs (namespace, name,
//! labels, the field-selector values of the built-in kinds that have any) from the object's
//! JSON as the upstream sent it, keeps those bytes as the object's canonical JSON, and
//! re-stamps `resourceVersion` without knowing the schema. The built-in kinds are also served
//! as protobuf, written from that JSON with the field numbers of [`protobuf`]'s schema; other
//! kinds (custom resources) are JSON, YAML and CBOR only, as Kubernetes serves them.
//!
//! The codec's functions take only the key-value, so the kind is read from the object itself
//! (`apiVersion`, `kind`): whoever feeds the cache must put them in (list items of built-in
//! kinds come without them, see [`with_type_meta`]).

pub mod protobuf;

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use svc_storage::{KeyValue, Revision};

use super::cached::{CachedObject, KindCodec};
use crate::registry;
use crate::resource::ResourceInfo;
use crate::status::ApiError;

/// A field selector a built-in kind supports: its name, where its value lies in the object
/// (a dotted path), and the value when that is absent (Kubernetes formats an unset boolean as
/// `false`).
#[derive(Debug, Clone)]
pub struct SelectableField {
    pub name: &'static str,
    pub path: &'static str,
    pub default: &'static str,
}

const fn field(name: &'static str, path: &'static str, default: &'static str) -> SelectableField {
    SelectableField {
        name,
        path,
        default,
    }
}

const POD_FIELDS: &[SelectableField] = &[
    field("spec.nodeName", "spec.nodeName", ""),
    field("spec.restartPolicy", "spec.restartPolicy", ""),
    field("spec.schedulerName", "spec.schedulerName", ""),
    field("spec.serviceAccountName", "spec.serviceAccountName", ""),
    field("spec.hostNetwork", "spec.hostNetwork", "false"),
    field("status.phase", "status.phase", ""),
    field("status.podIP", "status.podIP", ""),
    field("status.nominatedNodeName", "status.nominatedNodeName", ""),
];

const EVENT_FIELDS: &[SelectableField] = &[
    field("involvedObject.kind", "involvedObject.kind", ""),
    field("involvedObject.namespace", "involvedObject.namespace", ""),
    field("involvedObject.name", "involvedObject.name", ""),
    field("involvedObject.uid", "involvedObject.uid", ""),
    field("involvedObject.apiVersion", "involvedObject.apiVersion", ""),
    field(
        "involvedObject.resourceVersion",
        "involvedObject.resourceVersion",
        "",
    ),
    field("involvedObject.fieldPath", "involvedObject.fieldPath", ""),
    field("reason", "reason", ""),
    field("reportingComponent", "reportingComponent", ""),
    field("source", "source.component", ""),
    field("type", "type", ""),
];

const NODE_FIELDS: &[SelectableField] =
    &[field("spec.unschedulable", "spec.unschedulable", "false")];
const SERVICE_FIELDS: &[SelectableField] = &[
    field("spec.clusterIP", "spec.clusterIP", ""),
    field("spec.type", "spec.type", ""),
];
const REPLICAS_FIELDS: &[SelectableField] = &[field("status.replicas", "status.replicas", "0")];
const JOB_FIELDS: &[SelectableField] = &[field("status.successful", "status.successful", "0")];
const CSR_FIELDS: &[SelectableField] = &[field("spec.signerName", "spec.signerName", "")];

/// The field selectors a kind supports beyond `metadata.name` and `metadata.namespace`, as
/// kube-apiserver registers them for the built-in kinds; none for any other kind.
pub fn selectable_fields(group: &str, kind: &str) -> Cow<'static, [SelectableField]> {
    // A kind this server serves as well (Namespace, Secret) declares them in its own file.
    if let Some(served) = registry::all()
        .iter()
        .find(|i| i.group == group && i.kind == kind)
    {
        return served
            .extra_fields
            .iter()
            .map(|f| field(f, f, ""))
            .collect();
    }
    Cow::Borrowed(match (group, kind) {
        ("", "Pod") => POD_FIELDS,
        ("", "Event") => EVENT_FIELDS,
        ("", "Node") => NODE_FIELDS,
        ("", "Service") => SERVICE_FIELDS,
        ("", "ReplicationController") | ("apps", "ReplicaSet") => REPLICAS_FIELDS,
        ("batch", "Job") => JOB_FIELDS,
        ("certificates.k8s.io", "CertificateSigningRequest") => CSR_FIELDS,
        _ => &[],
    })
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → the core group).
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// A scalar's text as Kubernetes' field selectors compare it.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn lookup<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// The value at a dotted path (`spec.nodeName`).
fn lookup_dotted<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn invalid(what: &str) -> ApiError {
    ApiError::Internal(format!("an upstream object could not be read: {what}"))
}

/// Reads a key-value holding an object's JSON (with `apiVersion` and `kind`) into the cache's
/// form. The key-value's `mod_revision` is the object's `resourceVersion`.
pub fn ingest(kv: &KeyValue) -> Result<CachedObject, ApiError> {
    let v: Value = serde_json::from_slice(&kv.value).map_err(|e| invalid(&e.to_string()))?;
    let text = |path: &[&str]| lookup(&v, path).and_then(Value::as_str).unwrap_or("");
    let api_version = text(&["apiVersion"]);
    let kind = text(&["kind"]);
    let labels: BTreeMap<String, String> = lookup(&v, &["metadata", "labels"])
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let fields = selectable_fields(group_of(api_version), kind)
        .iter()
        .map(|f| {
            let value = lookup_dotted(&v, f.path)
                .and_then(scalar_text)
                .unwrap_or_else(|| f.default.to_string());
            (f.name, value)
        })
        .collect();
    Ok(CachedObject::new(
        kv.key.clone(),
        text(&["metadata", "namespace"]),
        text(&["metadata", "name"]),
        labels,
        fields,
        kv.mod_revision,
        kv.value.clone(),
    ))
}

/// The object's JSON with `metadata.resourceVersion` set to `revision`, the rest as it was
/// (field order kept).
pub fn restamp(json: &[u8], revision: Revision) -> Result<Vec<u8>, ApiError> {
    let mut v: Value = serde_json::from_slice(json).map_err(|e| invalid(&e.to_string()))?;
    let meta = v
        .as_object_mut()
        .ok_or_else(|| invalid("not a JSON object"))?
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(m) = meta.as_object_mut() {
        m.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
    }
    serde_json::to_vec(&v).map_err(ApiError::internal)
}

/// A codec for a kind described at run time: with protobuf where the kind is a built-in one.
pub fn codec(info: &'static ResourceInfo) -> KindCodec {
    let built_in = protobuf::has_kind(&info.api_version(), info.kind);
    KindCodec {
        info,
        ingest,
        restamp,
        protobuf: built_in.then_some(protobuf::encode as _),
        list_item_types: !built_in,
    }
}

/// What the cache needs of an object before its key can be built: its identity and version.
#[derive(Debug, Deserialize)]
pub struct ObjectHead<'a> {
    #[serde(default, rename = "apiVersion", borrow)]
    pub api_version: Option<&'a str>,
    #[serde(default, borrow)]
    pub kind: Option<&'a str>,
    #[serde(default, borrow)]
    pub metadata: HeadMeta<'a>,
}

#[derive(Debug, Default, Deserialize)]
pub struct HeadMeta<'a> {
    #[serde(default, borrow)]
    pub name: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    pub namespace: std::borrow::Cow<'a, str>,
    #[serde(default, rename = "resourceVersion", borrow)]
    pub resource_version: std::borrow::Cow<'a, str>,
}

/// The object's JSON with `apiVersion` and `kind` first when it came without them (the items
/// of a built-in kind's list do), so every cached object carries its type as a watch event's
/// object must. An object that has them is returned as it is, without a copy.
pub fn with_type_meta(json: Bytes, head: &ObjectHead<'_>, api_version: &str, kind: &str) -> Bytes {
    if head.api_version.is_some() && head.kind.is_some() {
        return json;
    }
    let rest = json.strip_prefix(b"{").unwrap_or(&json);
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut out = Vec::with_capacity(json.len().saturating_add(64));
    out.extend_from_slice(b"{\"apiVersion\":");
    out.extend_from_slice(&serde_json::to_vec(api_version).unwrap_or_default());
    out.extend_from_slice(b",\"kind\":");
    out.extend_from_slice(&serde_json::to_vec(kind).unwrap_or_default());
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(json: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: Bytes::from_static(b"/registry/pods/ns/p"),
            value: Bytes::from(json.to_string()),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
        }
    }

    #[test]
    fn reads_identity_labels_and_the_kinds_fields() {
        let obj = ingest(&kv(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","labels":{"app":"web"}},"spec":{"nodeName":"n1"},"status":{"phase":"Running"}}"#,
            7,
        ))
        .unwrap();
        assert_eq!((&*obj.namespace, &*obj.name), ("ns", "p"));
        assert_eq!(obj.labels.get("app"), Some("web"));
        assert_eq!(obj.field("spec.nodeName"), Some("n1"));
        assert_eq!(obj.field("status.phase"), Some("Running"));
        assert_eq!(obj.field("spec.hostNetwork"), Some("false"));
        assert_eq!(obj.field("spec.schedulerName"), Some(""));
        assert_eq!(obj.resource_version, 7);

        let cm = ingest(&kv(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"type":"x"}}"#,
            8,
        ))
        .unwrap();
        assert!(cm.fields.is_empty());
        let event = ingest(&kv(
            r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"e"},"involvedObject":{"kind":"Pod","name":"p"},"source":{"component":"kubelet"}}"#,
            9,
        ))
        .unwrap();
        assert_eq!(event.field("involvedObject.name"), Some("p"));
        assert_eq!(event.field("source"), Some("kubelet"));
        // A kind served here too has its fields from its own file.
        let secret = ingest(&kv(
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"type":"Opaque"}"#,
            10,
        ))
        .unwrap();
        assert_eq!(secret.field("type"), Some("Opaque"));
        let ns = ingest(&kv(
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n"},"status":{"phase":"Active"}}"#,
            11,
        ))
        .unwrap();
        assert_eq!(ns.field("status.phase"), Some("Active"));
        assert!(ingest(&kv("[1,2]", 1)).is_ok_and(|o| o.name.is_empty()));
        assert!(ingest(&kv("{", 1)).is_err());
    }

    #[test]
    fn selectable_fields_follow_the_kind() {
        let has = |group, kind, field| {
            selectable_fields(group, kind)
                .iter()
                .any(|f| f.name == field)
        };
        assert!(has("", "Pod", "spec.nodeName"));
        assert!(!has("example.com", "Widget", "spec.nodeName"));
        for (kind, field) in [("Secret", "type"), ("Namespace", "status.phase")] {
            assert!(has("", kind, field), "{kind} {field}");
        }
        assert!(!has("", "Secret", "status.phase"));
        assert!(has(
            "certificates.k8s.io",
            "CertificateSigningRequest",
            "spec.signerName"
        ));
    }

    #[test]
    fn restamp_keeps_order_and_sets_the_version() {
        let out = restamp(
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","resourceVersion":"3"},"spec":{}}"#,
            9,
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","resourceVersion":"9"},"spec":{}}"#
        );
        assert!(restamp(b"[]", 1).is_err());
    }

    #[test]
    fn type_meta_is_added_only_when_missing() {
        let head = |j: &'static str| serde_json::from_str::<ObjectHead<'_>>(j).unwrap();
        let item = r#"{"metadata":{"name":"p"}}"#;
        let out = with_type_meta(
            Bytes::from_static(item.as_bytes()),
            &head(item),
            "v1",
            "Pod",
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["metadata"]["name"], "p");
        let empty = "{}";
        let out = with_type_meta(Bytes::from_static(b"{}"), &head(empty), "v1", "Pod");
        assert_eq!(&out[..], br#"{"apiVersion":"v1","kind":"Pod"}"#);
        let full = r#"{"apiVersion":"v1","kind":"Pod","metadata":{}}"#;
        let out = with_type_meta(Bytes::from_static(full.as_bytes()), &head(full), "v1", "X");
        assert_eq!(&out[..], full.as_bytes());
    }
}
