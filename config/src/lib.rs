//! svc-config: the configuration files and plugin payloads of the second spec document, and
//! the sans-IO logic that reads them (audit policy evaluation, the EventRateLimit limiter).
//!
//! Every kind implements [`ConfigKind`]. [`load`] decodes a YAML or JSON document into it,
//! refuses unknown fields (all of them are listed, each with its path), then runs the kind's
//! own validation; the errors read as Kubernetes prints them:
//! `jwt[0].issuer.url: Invalid value: "http://x": must be https`. [`catalog`] dispatches
//! any document by `(apiVersion, kind)`, `validate-config`'s component kinds (scheduler,
//! proxy, controller manager) included.
//!
//! The server runs the same code on its own files at start as `svc-gateway validate-config`
//! does on any file.
//!
//! **Invariant:** configuration knows no HTTP, no sockets and no disks: it is given bytes and
//! returns typed values or field errors. It stands above `svc-core` (field errors, user
//! info, YAML) and `svc-cel` (match conditions, durations); neither of them depends on it.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use svc_core::strict;
use svc_core::validation::ErrorList;

pub use svc_cel::Duration;
pub use svc_core::validation::Path;

pub mod admission;
pub mod admission_review;
pub mod audit;
pub mod authentication;
pub mod authorization;
pub mod catalog;
pub mod component;
pub mod controller_manager;
pub mod egress;
pub mod event_rate_limit;
pub mod exec_credential;
pub mod image_review;
pub mod kubeconfig;
pub mod proxy;
pub mod rate_limit;
pub mod scheduler;
pub mod subject_access_review;
pub mod tracing;

/// A configuration kind: its versions, its name, its rules and its defaults.
pub trait ConfigKind: DeserializeOwned + Serialize {
    /// The `apiVersion` values this type decodes, the preferred first.
    const API_VERSIONS: &'static [&'static str];
    /// The `kind` field.
    const KIND: &'static str;

    /// Every rule of the spec's field tables and Limits table; each error names its path.
    fn validate(&self) -> ErrorList;

    /// Fills the spec's defaults (for `--print-defaults`, and before the server uses it).
    fn apply_defaults(&mut self) {}
}

/// Why a document was refused: every error found, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// What was being read, for example a file path or `AuthenticationConfiguration`.
    pub subject: String,
    pub errors: ErrorList,
}

impl ConfigError {
    pub fn new(subject: impl Into<String>, errors: ErrorList) -> Self {
        Self {
            subject: subject.into(),
            errors,
        }
    }

    fn one(subject: &str, field: &str, reason: &str, message: String) -> Self {
        let mut errors = ErrorList::default();
        errors.push(field, reason, message);
        Self::new(subject, errors)
    }

    /// Each error as Kubernetes prints a field error: `path: message`.
    pub fn lines(&self) -> Vec<String> {
        self.errors
            .0
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines = self.lines();
        write!(f, "{}: ", self.subject)?;
        if let [only] = lines.as_slice() {
            write!(f, "{only}")
        } else {
            write!(f, "[{}]", lines.join(", "))
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses one YAML or JSON document (JSON is YAML) into a JSON value. Duplicate keys are
/// refused.
pub fn parse_document(bytes: &[u8]) -> Result<Value, ConfigError> {
    let trimmed = bytes.trim_ascii_start();
    if trimmed.first() == Some(&b'{') {
        let (doc, duplicates) = strict::parse_json(trimmed)
            .map_err(|e| ConfigError::one("document", "", "FieldValueInvalid", e.to_string()))?;
        if let Some(first) = duplicates.first() {
            return Err(ConfigError::one(
                "document",
                "",
                "FieldValueInvalid",
                first.clone(),
            ));
        }
        return Ok(doc);
    }
    svc_core::codec::yaml::decode::<Value>(bytes)
        .map_err(|e| ConfigError::one("document", "", "FieldValueInvalid", e.to_string()))
}

/// The `apiVersion` and `kind` of a parsed document (empty strings where absent).
pub fn type_meta(doc: &Value) -> (String, String) {
    let field = |k: &str| {
        doc.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (field("apiVersion"), field("kind"))
}

/// Decodes `bytes` as `T`: the type meta must name `T`, no field may be unknown, and `T`'s
/// rules must hold. Defaults are applied after validation of what was written.
pub fn load<T: ConfigKind>(bytes: &[u8]) -> Result<T, ConfigError> {
    let doc = parse_document(bytes)?;
    load_value(doc)
}

/// [`load`] for an already parsed document.
pub fn load_value<T: ConfigKind>(doc: Value) -> Result<T, ConfigError> {
    check_type_meta::<T>(&doc)?;
    let mut value: T = decode_strict(doc).map_err(|e| ConfigError::new(T::KIND, e))?;
    let errors = value.validate();
    if !errors.is_empty() {
        return Err(ConfigError::new(T::KIND, errors));
    }
    value.apply_defaults();
    Ok(value)
}

/// Refuses a document whose `apiVersion` or `kind` is not `T`'s.
pub fn check_type_meta<T: ConfigKind>(doc: &Value) -> Result<(), ConfigError> {
    let (api_version, kind) = type_meta(doc);
    let mut errors = ErrorList::default();
    if api_version.is_empty() {
        errors.required("apiVersion", "");
    } else if !T::API_VERSIONS.contains(&api_version.as_str()) {
        errors.not_supported("apiVersion", &api_version, T::API_VERSIONS);
    }
    if kind.is_empty() {
        errors.required("kind", "");
    } else if kind != T::KIND {
        errors.not_supported("kind", &kind, &[T::KIND]);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::new(T::KIND, errors))
    }
}

/// Decodes `doc` into `T` with core's strict decoder, listing every unknown field with its
/// path (`apiVersion` and `kind` at the top are allowed whether or not `T` names them). A
/// type error names its path too.
pub fn decode_strict<T: DeserializeOwned>(doc: Value) -> Result<T, ErrorList> {
    let mut errors = ErrorList::default();
    match strict::decode(doc) {
        Ok((value, unknown)) => {
            let unknown: Vec<String> = unknown
                .into_iter()
                .filter(|p| p != "apiVersion" && p != "kind")
                .collect();
            if unknown.is_empty() {
                return Ok(value);
            }
            for path in unknown {
                let name = path.rsplit('.').next().unwrap_or(&path).to_string();
                errors.push(
                    &path,
                    "FieldValueInvalid",
                    format!("unknown field {name:?}"),
                );
            }
            Err(errors)
        }
        Err(e) => {
            errors.push(
                &e.path,
                "FieldValueInvalid",
                format!("Invalid value: {}", e.message),
            );
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sample {
        #[serde(default)]
        items: Vec<Item>,
        #[serde(default)]
        timeout: Option<Duration>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Item {
        name: String,
        #[serde(default)]
        count: i32,
    }

    impl ConfigKind for Sample {
        const API_VERSIONS: &'static [&'static str] =
            &["sample.svc.io/v1", "sample.svc.io/v1beta1"];
        const KIND: &'static str = "Sample";

        fn validate(&self) -> ErrorList {
            let mut errors = ErrorList::default();
            let items = Path::root("items");
            for (i, item) in self.items.iter().enumerate() {
                if item.count < 0 {
                    errors.invalid(
                        items.index(i).child("count").as_str(),
                        &item.count.to_string(),
                        "must be greater than or equal to 0",
                    );
                }
            }
            errors
        }

        fn apply_defaults(&mut self) {
            self.timeout.get_or_insert(Duration::from_secs(10));
        }
    }

    #[test]
    fn every_unknown_field_is_listed_with_its_path() {
        let doc = br#"{"apiVersion":"sample.svc.io/v1","kind":"Sample","extra":1,
            "items":[{"name":"a"},{"name":"b","colour":"red"}]}"#;
        let err = load::<Sample>(doc).unwrap_err();
        assert_eq!(
            err.lines(),
            [
                r#"extra: unknown field "extra""#,
                r#"items[1].colour: unknown field "colour""#
            ]
        );
    }

    #[test]
    fn duplicate_keys_are_refused_in_json_as_in_yaml() {
        let json = br#"{"apiVersion":"sample.svc.io/v1","kind":"Sample","items":[],"items":[]}"#;
        let err = load::<Sample>(json).unwrap_err();
        assert_eq!(err.lines(), [r#"duplicate field "items""#]);
        let yaml = b"apiVersion: sample.svc.io/v1\nkind: Sample\nitems: []\nitems: []\n";
        assert!(load::<Sample>(yaml).is_err());
    }

    #[test]
    fn type_errors_name_their_path() {
        let doc = b"apiVersion: sample.svc.io/v1\nkind: Sample\nitems:\n- name: a\n  count: lots\n";
        let err = load::<Sample>(doc).unwrap_err();
        assert_eq!(err.errors.0.len(), 1);
        assert_eq!(err.errors.0[0].field, "items[0].count");
    }

    #[test]
    fn validation_errors_read_as_kubernetes_prints_them() {
        let doc =
            b"apiVersion: sample.svc.io/v1beta1\nkind: Sample\nitems:\n- name: a\n  count: -2\n";
        let err = load::<Sample>(doc).unwrap_err();
        assert_eq!(
            err.lines(),
            [r#"items[0].count: Invalid value: "-2": must be greater than or equal to 0"#]
        );
        assert!(err.to_string().starts_with("Sample: items[0].count"));
    }

    #[test]
    fn wrong_type_meta_is_refused_and_defaults_fill_what_is_unset() {
        let err = load::<Sample>(b"apiVersion: v1\nkind: Other\n").unwrap_err();
        let fields: Vec<&str> = err.errors.0.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["apiVersion", "kind"]);
        let ok = load::<Sample>(b"apiVersion: sample.svc.io/v1\nkind: Sample\n").unwrap();
        assert_eq!(ok.timeout, Some(Duration::from_secs(10)));
    }
}
