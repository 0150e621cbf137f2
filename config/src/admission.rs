//! `AdmissionConfiguration` (`apiserver.svc.io/v1`, also `v1alpha1`), the file of
//! `--admission-control-config-file`: each admission plugin's configuration, inline
//! (`configuration`) or in a file of its own (`path`, relative to this file's directory).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ConfigKind, Path};
use svc_core::validation::ErrorList;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionConfiguration {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<AdmissionPluginConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionPluginConfiguration {
    /// The plugin's registered name (`EventRateLimit`).
    #[serde(default)]
    pub name: String,
    /// A file holding the plugin's configuration; relative paths are relative to the
    /// AdmissionConfiguration file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The plugin's configuration document, embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<Value>,
}

/// Where a plugin's configuration is.
#[derive(Clone, Debug, PartialEq)]
pub enum PluginSource<'a> {
    /// Embedded in the AdmissionConfiguration.
    Inline(&'a Value),
    /// In a file: the path as written (the caller resolves relative ones).
    File(&'a str),
}

impl AdmissionConfiguration {
    /// Where the configuration of plugin `name` is, if the file gives one.
    pub fn plugin(&self, name: &str) -> Option<PluginSource<'_>> {
        let entry = self.plugins.iter().find(|p| p.name == name)?;
        match (&entry.configuration, entry.path.as_str()) {
            (Some(v), _) => Some(PluginSource::Inline(v)),
            (None, "") => None,
            (None, path) => Some(PluginSource::File(path)),
        }
    }
}

impl ConfigKind for AdmissionConfiguration {
    const API_VERSIONS: &'static [&'static str] =
        &["apiserver.svc.io/v1", "apiserver.svc.io/v1alpha1"];
    const KIND: &'static str = "AdmissionConfiguration";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let plugins = Path::root("plugins");
        for (i, p) in self.plugins.iter().enumerate() {
            let at = plugins.index(i);
            if p.name.is_empty() {
                errors.required(at.child("name").as_str(), "");
            } else if self.plugins.iter().take(i).any(|q| q.name == p.name) {
                errors.duplicate(at.child("name").as_str(), &p.name);
            }
            match (&p.configuration, p.path.is_empty()) {
                (Some(_), false) => errors.forbidden(
                    at.child("configuration").as_str(),
                    "may not be set together with path",
                ),
                (None, true) => errors.required(at.as_str(), "one of path or configuration"),
                (Some(v), true) if !v.is_object() => errors.invalid(
                    at.child("configuration").as_str(),
                    &v.to_string(),
                    "must be a configuration document (an object with apiVersion and kind)",
                ),
                _ => {}
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    #[test]
    fn plugins_are_given_inline_or_by_path() {
        let c: AdmissionConfiguration = load(
            br#"
apiVersion: apiserver.svc.io/v1
kind: AdmissionConfiguration
plugins:
- name: EventRateLimit
  configuration:
    apiVersion: eventratelimit.admission.svc.io/v1alpha1
    kind: Configuration
    limits: [{type: Server, qps: 1, burst: 1}]
- name: Other
  path: other.yaml
"#,
        )
        .unwrap();
        match c.plugin("EventRateLimit") {
            Some(PluginSource::Inline(v)) => assert_eq!(v["kind"], "Configuration"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.plugin("Other"), Some(PluginSource::File("other.yaml")));
        assert_eq!(c.plugin("Missing"), None);
        let alpha: AdmissionConfiguration =
            load(b"apiVersion: apiserver.svc.io/v1alpha1\nkind: AdmissionConfiguration\n").unwrap();
        assert!(alpha.plugins.is_empty());
    }

    #[test]
    fn invalid_entries_name_their_fields() {
        for (plugins, expected) in [
            ("- path: a.yaml\n", vec!["plugins[0].name"]),
            ("- name: A\n", vec!["plugins[0]"]),
            (
                "- name: A\n  path: a.yaml\n  configuration: {kind: X}\n",
                vec!["plugins[0].configuration"],
            ),
            (
                "- name: A\n  configuration: 3\n",
                vec!["plugins[0].configuration"],
            ),
            (
                "- name: A\n  path: a.yaml\n- name: A\n  path: b.yaml\n",
                vec!["plugins[1].name"],
            ),
            (
                "- name: A\n  path: a.yaml\n  paths: []\n",
                vec!["plugins[0].paths"],
            ),
        ] {
            let doc = format!(
                "apiVersion: apiserver.svc.io/v1\nkind: AdmissionConfiguration\nplugins:\n{plugins}"
            );
            let err = load::<AdmissionConfiguration>(doc.as_bytes()).unwrap_err();
            let fields: Vec<&str> = err.errors.0.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, expected, "{plugins}");
        }
    }
}
