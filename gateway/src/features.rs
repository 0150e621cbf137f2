//! Feature gates (`--feature-gates=Name=true,Other=false`), with the defaults of the spec;
//! an unknown gate or a malformed value is refused at start with a clear error.

use std::collections::BTreeMap;
use std::fmt;

/// Every gate the server knows, with its default.
pub const KNOWN: &[(&str, bool)] = &[
    // Beta, on: gzip for get and list.
    ("APIResponseCompression", true),
    // Alpha, off: force deletion of objects that cannot be read from storage.
    ("AllowUnsafeMalformedObjectDeletion", false),
    // Alpha, off: CBOR request and response bodies, cbor-seq watches.
    ("CBORServingAndStorage", false),
    // Beta, on: declarative validation runs beside the hand-written one.
    ("DeclarativeValidation", true),
    // Beta, off: the declarative result is authoritative.
    ("DeclarativeValidationTakeover", false),
    // Exact lists and continue tokens from cache snapshots.
    ("ListFromCacheSnapshot", true),
    // Beta, off: streaming lists (`sendInitialEvents` on watch).
    ("WatchList", false),
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            enabled: KNOWN.iter().copied().collect(),
        }
    }
}

impl FeatureGates {
    /// Parses the flag's value on top of the defaults.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut gates = FeatureGates::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').ok_or_else(|| {
                format!("missing bool value for feature gate {part:?} (want Name=true|false)")
            })?;
            let (name, value) = (name.trim(), value.trim());
            let value = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(format!(
                        "invalid value of {name}={value}, want true or false"
                    ));
                }
            };
            let Some((known, _)) = KNOWN.iter().find(|(k, _)| *k == name) else {
                let names: Vec<&str> = KNOWN.iter().map(|(k, _)| *k).collect();
                return Err(format!(
                    "unrecognized feature gate: {name} (known: {})",
                    names.join(", ")
                ));
            };
            gates.enabled.insert(known, value);
        }
        Ok(gates)
    }

    /// Whether a gate is on. Asking for a gate that does not exist is a programming error
    /// and answers false.
    pub fn enabled(&self, name: &str) -> bool {
        self.enabled.get(name).copied().unwrap_or(false)
    }

    /// Sets a gate (tests, embedding).
    pub fn set(&mut self, name: &'static str, value: bool) {
        self.enabled.insert(name, value);
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .enabled
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let g = FeatureGates::parse("APIResponseCompression=false, CBORServingAndStorage=true")
            .unwrap();
        assert!(!g.enabled("APIResponseCompression"));
        assert!(g.enabled("CBORServingAndStorage"));
        assert!(g.enabled("ListFromCacheSnapshot"));
        assert!(!FeatureGates::default().enabled("WatchList"));
        assert!(FeatureGates::parse("").unwrap() == FeatureGates::default());
        assert!(
            FeatureGates::parse("NoSuchGate=true")
                .unwrap_err()
                .contains("unrecognized feature gate: NoSuchGate")
        );
        assert!(FeatureGates::parse("WatchList").is_err());
        assert!(FeatureGates::parse("WatchList=yes").is_err());
    }
}
