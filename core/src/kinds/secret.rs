//! `Secret` (`v1`, namespaced): named bytes, wire-identical to Kubernetes. Tokens can be
//! bound to one, so a token lives only as long as the Secret does.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::codec::convert::{object_meta_from_wire, object_meta_to_wire};
use crate::codec::{ProtoKind, decode_error};
use crate::meta::ObjectMeta;
use crate::resource::{Column, Resource, ResourceInfo, STANDARD_VERBS, Scope};
use crate::status::ApiError;
use crate::validation::{ErrorList, NameRule};

/// The type of a Secret without one.
pub const TYPE_OPAQUE: &str = "Opaque";
/// Kubernetes' limit on the bytes of all values of one Secret.
pub const MAX_SECRET_BYTES: usize = 1024 * 1024;
const MAX_KEY_LEN: usize = 253;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Values, base64 in JSON as Kubernetes writes `[]byte`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// Write-only plain-text values, merged into `data` on write and never stored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub string_data: BTreeMap<String, String>,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
}

static INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "Secret",
    list_kind: "SecretList",
    plural: "secrets",
    singular: "secret",
    short_names: &[],
    scope: Scope::Namespaced,
    verbs: STANDARD_VERBS,
    name_rule: NameRule::Dns1123Subdomain,
    extra_fields: &["type"],
    allow_create_on_update: false,
    delete_returns_object: false,
    merge_strategies: &[],
    columns: &[
        Column {
            name: "Type",
            ty: "string",
            format: "",
            priority: 0,
            description: "The type of the secret",
            cell: |o, _| o.get("type").cloned().unwrap_or(Value::Null),
        },
        Column {
            name: "Data",
            ty: "string",
            format: "",
            priority: 0,
            description: "The number of entries in the secret's data",
            cell: |o, _| {
                json!(
                    o.get("data")
                        .and_then(Value::as_object)
                        .map_or(0, |m| m.len())
                )
            },
        },
        Column {
            name: "Age",
            ty: "string",
            format: "",
            priority: 0,
            description: "Time since the secret was created",
            cell: |o, now| {
                json!(crate::table::age(
                    o.pointer("/metadata/creationTimestamp")
                        .and_then(Value::as_str),
                    now,
                ))
            },
        },
    ],
    schema,
    subresources: &[],
    stored: true,
    expires: false,
};

fn schema() -> Value {
    let bytes_map =
        json!({"type": "object", "additionalProperties": {"type": "string", "format": "byte"}});
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({
        "data": bytes_map,
        "stringData": string_map,
        "type": {"type": "string"},
        "immutable": {"type": "boolean"},
    })
}

/// A key Kubernetes accepts in a Secret or ConfigMap: `[-._a-zA-Z0-9]+`, not `.` or `..`.
fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_LEN
        && k != "."
        && k != ".."
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl Secret {
    /// `stringData` merged into `data` (plain text wins, as in Kubernetes) and cleared.
    fn fold_string_data(&mut self) {
        for (k, v) in std::mem::take(&mut self.string_data) {
            self.data.insert(k, STANDARD.encode(v.as_bytes()));
        }
    }

    /// The decoded value of `key`, if present and valid base64.
    pub fn value(&self, key: &str) -> Option<Vec<u8>> {
        self.data.get(key).and_then(|v| STANDARD.decode(v).ok())
    }
}

impl Secret {
    /// The keys each well-known type needs, as Kubernetes checks them.
    fn validate_type(&self, errs: &mut ErrorList) {
        let has = |k: &str| self.data.contains_key(k);
        let key = |k: &str| format!("data[{k}]");
        match self.type_.as_str() {
            TYPE_SERVICE_ACCOUNT_TOKEN => {
                let name = self
                    .metadata
                    .annotations
                    .get(ANNOTATION_SERVICE_ACCOUNT_NAME);
                if name.is_none_or(String::is_empty) {
                    errs.required(
                        &format!("metadata.annotations[{ANNOTATION_SERVICE_ACCOUNT_NAME}]"),
                        "",
                    );
                }
            }
            t @ (TYPE_DOCKERCFG | TYPE_DOCKER_CONFIG_JSON) => {
                let k = if t == TYPE_DOCKERCFG {
                    ".dockercfg"
                } else {
                    ".dockerconfigjson"
                };
                match self.data.get(k) {
                    None => errs.required(&key(k), ""),
                    Some(v) => {
                        let parsed = STANDARD
                            .decode(v)
                            .ok()
                            .map(|b| serde_json::from_slice::<serde_json::Map<String, Value>>(&b));
                        if let Some(Err(e)) = parsed {
                            errs.invalid(&key(k), "<secret contents redacted>", &e.to_string());
                        }
                    }
                }
            }
            // Either may be empty, but one must be there.
            TYPE_BASIC_AUTH if !has("username") && !has("password") => {
                errs.required(&key("username"), "");
                errs.required(&key("password"), "");
            }
            TYPE_SSH_AUTH if self.data.get("ssh-privatekey").is_none_or(String::is_empty) => {
                errs.required(&key("ssh-privatekey"), "");
            }
            TYPE_TLS => {
                for k in ["tls.crt", "tls.key"] {
                    if !has(k) {
                        errs.required(&key(k), "");
                    }
                }
            }
            _ => {}
        }
    }
}

const TYPE_SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";
const ANNOTATION_SERVICE_ACCOUNT_NAME: &str = "kubernetes.io/service-account.name";
const TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
const TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
const TYPE_BASIC_AUTH: &str = "kubernetes.io/basic-auth";
const TYPE_SSH_AUTH: &str = "kubernetes.io/ssh-auth";
const TYPE_TLS: &str = "kubernetes.io/tls";

impl Resource for Secret {
    const INFO: &'static ResourceInfo = &INFO;

    crate::resource::object_accessors!();

    fn prepare_for_create(&mut self) {
        self.fold_string_data();
        if self.type_.is_empty() {
            self.type_ = TYPE_OPAQUE.into();
        }
    }

    fn prepare_for_update(&mut self, _old: &Self) {
        self.fold_string_data();
        if self.type_.is_empty() {
            self.type_ = TYPE_OPAQUE.into();
        }
    }

    fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::default();
        let mut total = 0usize;
        for (k, v) in &self.data {
            let field = format!("data[{k}]");
            if !valid_key(k) {
                errs.invalid(
                    &field,
                    k,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                );
            }
            match STANDARD.decode(v) {
                Ok(bytes) => total = total.saturating_add(bytes.len()),
                Err(_) => errs.invalid(&field, "<value>", "illegal base64 data"),
            }
        }
        if total > MAX_SECRET_BYTES {
            errs.too_long("data", MAX_SECRET_BYTES);
        }
        self.validate_type(&mut errs);
        errs
    }

    /// Kubernetes' order: what may not change first, then the object as a whole.
    fn validate_update(&self, old: &Self) -> ErrorList {
        let mut errs = ErrorList::default();
        if self.type_ != old.type_ {
            errs.invalid("type", &self.type_, "field is immutable");
        }
        if old.immutable == Some(true) {
            if self.immutable != Some(true) {
                errs.forbidden("immutable", "field is immutable when `immutable` is set");
            }
            if self.data != old.data {
                errs.forbidden("data", "field is immutable when `immutable` is set");
            }
        }
        errs.extend(self.validate());
        errs
    }

    fn field_value(&self, field: &str) -> Option<String> {
        (field == "type").then(|| self.type_.clone())
    }
}

impl ProtoKind for Secret {
    fn to_proto_bytes(&self) -> Vec<u8> {
        wire::Secret {
            metadata: Some(object_meta_to_wire(&self.metadata)),
            data: self
                .data
                .iter()
                .map(|(k, v)| (k.clone(), STANDARD.decode(v).unwrap_or_default()))
                .collect(),
            type_: (!self.type_.is_empty()).then(|| self.type_.clone()),
            string_data: self.string_data.clone(),
            immutable: self.immutable,
        }
        .encode_to_vec()
    }

    fn from_proto_bytes(raw: &[u8]) -> Result<Self, ApiError> {
        let m = wire::Secret::decode(raw).map_err(|e| decode_error("Secret", e))?;
        Ok(Secret {
            api_version: String::new(),
            kind: String::new(),
            metadata: object_meta_from_wire(m.metadata.unwrap_or_default())?,
            data: m
                .data
                .into_iter()
                .map(|(k, v)| (k, STANDARD.encode(v)))
                .collect(),
            string_data: m.string_data,
            type_: m.type_.unwrap_or_default(),
            immutable: m.immutable,
        })
    }
}

/// `k8s.io.api.core.v1.Secret` (tags from Kubernetes' `generated.proto`).
mod wire {
    use std::collections::BTreeMap;

    pub(crate) use crate::codec::wire::ObjectMeta;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Secret {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(btree_map = "string, bytes", tag = "2")]
        pub data: BTreeMap<String, Vec<u8>>,
        #[prost(string, optional, tag = "3")]
        pub type_: Option<String>,
        #[prost(btree_map = "string, string", tag = "4")]
        pub string_data: BTreeMap<String, String>,
        #[prost(bool, optional, tag = "5")]
        pub immutable: Option<bool>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn string_data_folds_into_data_and_type_defaults() {
        let mut s = Secret::default();
        s.string_data.insert("token".into(), "abc".into());
        s.prepare_for_create();
        assert_eq!(s.data["token"], "YWJj");
        assert!(s.string_data.is_empty());
        assert_eq!(s.type_, TYPE_OPAQUE);
        assert_eq!(s.value("token").unwrap(), b"abc");
    }

    #[test]
    fn keys_values_and_size_are_checked() {
        let fields =
            |s: &Secret| -> Vec<String> { s.validate().0.into_iter().map(|c| c.field).collect() };
        assert!(fields(&secret(&[("a.b-c_d", "YWJj")])).is_empty());
        assert_eq!(fields(&secret(&[("a/b", "YWJj")])), ["data[a/b]"]);
        assert_eq!(fields(&secret(&[("..", "YWJj")])), ["data[..]"]);
        assert_eq!(fields(&secret(&[("k", "not base64!")])), ["data[k]"]);
        let big = STANDARD.encode(vec![0u8; MAX_SECRET_BYTES + 1]);
        assert_eq!(fields(&secret(&[("k", &big)])), ["data"]);
    }

    #[test]
    fn type_and_immutable_data_cannot_change() {
        let mut old = secret(&[("k", "YWJj")]);
        old.type_ = TYPE_OPAQUE.into();
        old.immutable = Some(true);
        let mut new = old.clone();
        new.data.insert("k".into(), "eHl6".into());
        new.type_ = "other".into();
        let fields: Vec<String> = new
            .validate_update(&old)
            .0
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["type", "data"]);
    }

    #[test]
    fn well_known_types_need_their_keys() {
        let fields = |type_: &str, data: &[(&str, &str)]| -> Vec<String> {
            let mut s = secret(data);
            s.type_ = type_.into();
            s.validate().0.into_iter().map(|c| c.field).collect()
        };
        assert_eq!(
            fields(TYPE_BASIC_AUTH, &[("other", "dg==")]),
            ["data[username]", "data[password]"]
        );
        assert!(fields(TYPE_BASIC_AUTH, &[("password", "")]).is_empty());
        assert_eq!(fields(TYPE_TLS, &[("tls.crt", "dg==")]), ["data[tls.key]"]);
        assert_eq!(
            fields(TYPE_SSH_AUTH, &[("ssh-privatekey", "")]),
            ["data[ssh-privatekey]"]
        );
        // "{}" and "[1]" in base64: an object is well-formed, an array is not.
        assert!(fields(TYPE_DOCKER_CONFIG_JSON, &[(".dockerconfigjson", "e30=")]).is_empty());
        assert_eq!(
            fields(TYPE_DOCKER_CONFIG_JSON, &[(".dockerconfigjson", "WzFd")]),
            ["data[.dockerconfigjson]"]
        );
        assert_eq!(fields(TYPE_DOCKERCFG, &[]), ["data[.dockercfg]"]);
        assert_eq!(
            fields(TYPE_SERVICE_ACCOUNT_TOKEN, &[]),
            ["metadata.annotations[kubernetes.io/service-account.name]"]
        );
        assert!(fields(TYPE_OPAQUE, &[]).is_empty());
        assert!(fields("example.com/custom", &[]).is_empty());
    }

    #[test]
    fn protobuf_round_trip() {
        let mut s = secret(&[("k", "YWJj")]);
        s.type_ = TYPE_OPAQUE.into();
        s.immutable = Some(false);
        let back = Secret::from_proto_bytes(&s.to_proto_bytes()).unwrap();
        assert_eq!(back, s);
    }
}
