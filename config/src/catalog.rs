//! Every configuration kind by `apiVersion` and `kind`, one line each: what
//! `svc-gateway validate-config` dispatches on. A new kind is one more line in [`KINDS`].

use serde_json::Value;

use super::{ConfigError, ConfigKind, load_value, type_meta};
use svc_core::validation::ErrorList;

/// One configuration kind: its versions, its name, and how to validate and default it.
#[derive(Clone, Copy)]
pub struct Entry {
    pub api_versions: &'static [&'static str],
    pub kind: &'static str,
    /// Decodes strictly, validates, applies the defaults, and returns the defaulted document
    /// (with the `apiVersion` it was written in).
    pub load: fn(Value) -> Result<Value, ConfigError>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("api_versions", &self.api_versions)
            .field("kind", &self.kind)
            .finish()
    }
}

/// The entry of kind `T`.
pub const fn entry<T: ConfigKind>() -> Entry {
    Entry {
        api_versions: T::API_VERSIONS,
        kind: T::KIND,
        load: load_defaulted::<T>,
    }
}

/// Every kind this build knows.
pub const KINDS: &[Entry] = &[
    entry::<super::authentication::AuthenticationConfiguration>(),
    entry::<super::egress::EgressSelectorConfiguration>(),
    entry::<super::tracing::TracingConfiguration>(),
    entry::<super::admission::AdmissionConfiguration>(),
    entry::<super::authorization::AuthorizationConfiguration>(),
    entry::<super::exec_credential::ExecCredential>(),
    entry::<super::kubeconfig::Config>(),
    entry::<super::event_rate_limit::Configuration>(),
    entry::<super::image_review::ImageReview>(),
    entry::<super::admission_review::AdmissionReview>(),
    entry::<super::audit::Policy>(),
    entry::<super::audit::Event>(),
    entry::<super::proxy::SvcProxyConfiguration>(),
    entry::<super::scheduler::SvcSchedulerConfiguration>(),
    entry::<super::scheduler::args::DefaultPreemptionArgs>(),
    entry::<super::scheduler::args::InterPodAffinityArgs>(),
    entry::<super::scheduler::args::NodeAffinityArgs>(),
    entry::<super::scheduler::args::NodeResourcesBalancedAllocationArgs>(),
    entry::<super::scheduler::args::NodeResourcesFitArgs>(),
    entry::<super::scheduler::args::PodTopologySpreadArgs>(),
    entry::<super::scheduler::args::VolumeBindingArgs>(),
    entry::<super::controller_manager::CloudControllerManagerConfiguration>(),
];

fn load_defaulted<T: ConfigKind>(doc: Value) -> Result<Value, ConfigError> {
    let (api_version, _) = type_meta(&doc);
    let value: T = load_value(doc)?;
    let mut out = serde_json::to_value(&value).map_err(|e| {
        let mut errors = ErrorList::default();
        errors.push("", "InternalError", format!("encoding {}: {e}", T::KIND));
        ConfigError::new(T::KIND, errors)
    })?;
    if let Value::Object(map) = &mut out {
        map.insert("apiVersion".into(), api_version.into());
        map.insert("kind".into(), T::KIND.into());
    }
    Ok(out)
}

/// The entry for `(api_version, kind)`, if this build knows it.
pub fn find(api_version: &str, kind: &str) -> Option<&'static Entry> {
    KINDS
        .iter()
        .find(|e| e.kind == kind && e.api_versions.contains(&api_version))
}

/// Validates and defaults one parsed document of any known kind. An unknown kind, or a known
/// kind in a version it does not have, is an error naming `kind` or `apiVersion`.
pub fn load_any(doc: Value) -> Result<Value, ConfigError> {
    let (api_version, kind) = type_meta(&doc);
    if let Some(entry) = find(&api_version, &kind) {
        return (entry.load)(doc);
    }
    let subject = if kind.is_empty() {
        "document"
    } else {
        kind.as_str()
    };
    let mut errors = ErrorList::default();
    if !doc.is_object() {
        errors.invalid(
            "",
            &compact(&doc),
            "a configuration document must be an object",
        );
        return Err(ConfigError::new(subject, errors));
    }
    let versions: Vec<&str> = KINDS
        .iter()
        .filter(|e| e.kind == kind)
        .flat_map(|e| e.api_versions.iter().copied())
        .collect();
    if kind.is_empty() {
        errors.required("kind", "");
    } else if versions.is_empty() {
        let kinds: Vec<&str> = KINDS.iter().map(|e| e.kind).collect();
        errors.not_supported("kind", &kind, &kinds);
    }
    if api_version.is_empty() {
        errors.required("apiVersion", "");
    } else if !versions.is_empty() {
        errors.not_supported("apiVersion", &api_version, &versions);
    }
    Err(ConfigError::new(subject, errors))
}

fn compact(v: &Value) -> String {
    let text = v.to_string();
    if text.len() > 64 {
        format!("{}...", &text[..text.floor_char_boundary(64)])
    } else {
        text
    }
}

/// A defaulted document as YAML, keys sorted as Kubernetes' YAML printer sorts them.
pub fn to_yaml(value: &Value) -> Result<Vec<u8>, svc_core::ApiError> {
    svc_core::codec::yaml::encode(&sorted(value.clone()))
}

/// `value` with every object's keys in sorted order, whatever the map's own order is.
pub fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
