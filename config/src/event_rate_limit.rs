//! The EventRateLimit admission plugin's configuration (`eventratelimit.admission.svc.io/v1alpha1`,
//! kind `Configuration`): a list of token-bucket limits, each kept server-wide, per namespace,
//! per user, or per event source and regarding object. The limiter itself is
//! `crate::rate_limit`.

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Path};
use svc_core::validation::ErrorList;

/// `cacheSize` when unset or 0, as Kubernetes' `defaultCacheSize`.
pub const DEFAULT_CACHE_SIZE: i32 = 4096;

/// One bucket for every event the server receives.
pub const SERVER: &str = "Server";
/// One bucket per namespace.
pub const NAMESPACE: &str = "Namespace";
/// One bucket per user name.
pub const USER: &str = "User";
/// One bucket per event source (reporting controller and instance) and regarding object.
pub const SOURCE_AND_OBJECT: &str = "SourceAndObject";

pub const LIMIT_TYPES: &[&str] = &[SERVER, NAMESPACE, USER, SOURCE_AND_OBJECT];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// At least one.
    #[serde(default)]
    pub limits: Vec<Limit>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limit {
    /// One of [`LIMIT_TYPES`].
    #[serde(default, rename = "type")]
    pub type_: String,
    /// Allowance added per second, up to `burst`.
    #[serde(default)]
    pub qps: i32,
    /// The most a bucket holds (and what a new bucket starts with).
    #[serde(default)]
    pub burst: i32,
    /// How many buckets the LRU keeps; ignored for `Server`. 0 means the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_size: Option<i32>,
}

impl Limit {
    /// The number of buckets kept: `cacheSize`, or the default when unset or 0.
    pub fn effective_cache_size(&self) -> usize {
        match self.cache_size {
            Some(n) if n > 0 => n as usize,
            _ => DEFAULT_CACHE_SIZE as usize,
        }
    }
}

impl ConfigKind for Configuration {
    const API_VERSIONS: &'static [&'static str] = &["eventratelimit.admission.svc.io/v1alpha1"];
    const KIND: &'static str = "Configuration";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let limits = Path::root("limits");
        if self.limits.is_empty() {
            errors.required(limits.as_str(), "must have at least one limit");
        }
        let mut seen: Vec<&str> = Vec::new();
        for (i, limit) in self.limits.iter().enumerate() {
            let at = limits.index(i);
            let ty = at.child("type");
            if limit.type_.is_empty() {
                errors.required(ty.as_str(), "");
            } else if !LIMIT_TYPES.contains(&limit.type_.as_str()) {
                errors.not_supported(ty.as_str(), &limit.type_, LIMIT_TYPES);
            } else if seen.contains(&limit.type_.as_str()) {
                // Two limits of one type would count every event twice against buckets with
                // the same keys: almost certainly a mistake.
                errors.duplicate(ty.as_str(), &limit.type_);
            } else {
                seen.push(&limit.type_);
            }
            if limit.qps <= 0 {
                errors.invalid(
                    at.child("qps").as_str(),
                    &limit.qps.to_string(),
                    "must be positive",
                );
            }
            if limit.burst <= 0 {
                errors.invalid(
                    at.child("burst").as_str(),
                    &limit.burst.to_string(),
                    "must be positive",
                );
            }
            if limit.type_ != SERVER
                && let Some(n) = limit.cache_size
                && n < 0
            {
                errors.invalid(
                    at.child("cacheSize").as_str(),
                    &n.to_string(),
                    "must not be negative",
                );
            }
        }
        errors
    }

    fn apply_defaults(&mut self) {
        for limit in &mut self.limits {
            if limit.type_ != SERVER && limit.cache_size.is_none_or(|n| n == 0) {
                limit.cache_size = Some(DEFAULT_CACHE_SIZE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    fn doc(limits: &str) -> String {
        format!(
            "apiVersion: eventratelimit.admission.svc.io/v1alpha1\nkind: Configuration\n{limits}"
        )
    }

    #[test]
    fn valid_configurations_load_with_defaults() {
        let c: Configuration = load(
            doc("limits:\n- type: Namespace\n  qps: 3\n  burst: 10\n- type: Server\n  qps: 50\n  burst: 100\n- type: User\n  qps: 1\n  burst: 1\n  cacheSize: 7\n")
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(c.limits.len(), 3);
        assert_eq!(c.limits[0].cache_size, Some(4096));
        assert_eq!(c.limits[1].cache_size, None, "ignored for Server");
        assert_eq!(c.limits[2].cache_size, Some(7));
        assert_eq!(c.limits[2].effective_cache_size(), 7);
        let c: Configuration = load(
            doc("limits:\n- type: SourceAndObject\n  qps: 1\n  burst: 2\n  cacheSize: 0\n")
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(c.limits[0].cache_size, Some(4096));
    }

    #[test]
    fn invalid_configurations_name_their_fields() {
        for (limits, expected) in [
            ("limits: []\n", vec![("limits", "FieldValueRequired")]),
            ("", vec![("limits", "FieldValueRequired")]),
            (
                "limits:\n- type: Pod\n  qps: 1\n  burst: 1\n",
                vec![("limits[0].type", "FieldValueNotSupported")],
            ),
            (
                "limits:\n- qps: 1\n  burst: 1\n",
                vec![("limits[0].type", "FieldValueRequired")],
            ),
            (
                "limits:\n- type: User\n  qps: 0\n  burst: -1\n",
                vec![
                    ("limits[0].qps", "FieldValueInvalid"),
                    ("limits[0].burst", "FieldValueInvalid"),
                ],
            ),
            (
                "limits:\n- type: User\n  qps: 1\n  burst: 1\n  cacheSize: -1\n",
                vec![("limits[0].cacheSize", "FieldValueInvalid")],
            ),
            (
                "limits:\n- type: User\n  qps: 1\n  burst: 1\n- type: User\n  qps: 2\n  burst: 2\n",
                vec![("limits[1].type", "FieldValueDuplicate")],
            ),
            (
                "limits:\n- type: User\n  qps: 1\n  burst: 1\n  size: 3\n",
                vec![("limits[0].size", "FieldValueInvalid")],
            ),
        ] {
            let err = load::<Configuration>(doc(limits).as_bytes()).unwrap_err();
            let got: Vec<(&str, &str)> = err
                .errors
                .0
                .iter()
                .map(|c| (c.field.as_str(), c.reason.as_str()))
                .collect();
            assert_eq!(got, expected, "{limits}");
        }
        // A negative cacheSize is ignored for Server, as the size itself is.
        load::<Configuration>(
            doc("limits:\n- type: Server\n  qps: 1\n  burst: 1\n  cacheSize: -1\n").as_bytes(),
        )
        .unwrap();
        let err =
            load::<Configuration>(doc("limits:\n- type: User\n  qps: 1\n  burst: 0\n").as_bytes())
                .unwrap_err();
        assert_eq!(
            err.lines(),
            [r#"limits[0].burst: Invalid value: "0": must be positive"#]
        );
    }
}
