//! Feature gates (`--feature-gates=Name=true,Other=false`), with the defaults of the spec.
//! A gate is a [`Feature`], so code cannot ask about a misspelt one; an unknown name or a
//! malformed value on the command line is refused at start with a clear error.

use std::fmt;

/// Every gate the server knows. Each one changes behaviour; none is accepted and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// Beta, on: gzip for get and list (`server.rs`).
    APIResponseCompression,
    /// Alpha, off: force deletion of objects that cannot be read from storage
    /// (`rest/write.rs`).
    AllowUnsafeMalformedObjectDeletion,
    /// Alpha, off: CBOR request and response bodies, cbor-seq watches (`negotiate.rs`).
    CBORServingAndStorage,
    /// Beta, on: declarative validation runs beside the hand-written one and the two are
    /// compared (`svc_core::validation::declarative`).
    DeclarativeValidation,
    /// Beta, off: the declarative result is the one returned (needs `DeclarativeValidation`).
    DeclarativeValidationTakeover,
    /// Beta, on: Exact lists and continue tokens from watch-cache snapshots; off, they read
    /// the store's history and the caches keep no snapshots (`rest/list.rs`).
    ListFromCacheSnapshot,
    /// Beta, off: streaming lists (`sendInitialEvents` on watch).
    WatchList,
}

impl Feature {
    /// Every gate, in name order.
    pub const ALL: [Feature; 7] = [
        Feature::APIResponseCompression,
        Feature::AllowUnsafeMalformedObjectDeletion,
        Feature::CBORServingAndStorage,
        Feature::DeclarativeValidation,
        Feature::DeclarativeValidationTakeover,
        Feature::ListFromCacheSnapshot,
        Feature::WatchList,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Feature::APIResponseCompression => "APIResponseCompression",
            Feature::AllowUnsafeMalformedObjectDeletion => "AllowUnsafeMalformedObjectDeletion",
            Feature::CBORServingAndStorage => "CBORServingAndStorage",
            Feature::DeclarativeValidation => "DeclarativeValidation",
            Feature::DeclarativeValidationTakeover => "DeclarativeValidationTakeover",
            Feature::ListFromCacheSnapshot => "ListFromCacheSnapshot",
            Feature::WatchList => "WatchList",
        }
    }

    /// The spec's default.
    pub fn default_enabled(self) -> bool {
        match self {
            Feature::APIResponseCompression
            | Feature::DeclarativeValidation
            | Feature::ListFromCacheSnapshot => true,
            Feature::AllowUnsafeMalformedObjectDeletion
            | Feature::CBORServingAndStorage
            | Feature::DeclarativeValidationTakeover
            | Feature::WatchList => false,
        }
    }

    pub fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: [bool; Feature::ALL.len()],
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            enabled: Feature::ALL.map(Feature::default_enabled),
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
            let Some(feature) = Feature::from_name(name) else {
                let names: Vec<&str> = Feature::ALL.iter().map(|f| f.name()).collect();
                return Err(format!(
                    "unrecognized feature gate: {name} (known: {})",
                    names.join(", ")
                ));
            };
            gates.set(feature, value);
        }
        Ok(gates)
    }

    /// Whether a gate is on.
    pub fn enabled(&self, feature: Feature) -> bool {
        self.enabled.get(feature.index()).copied().unwrap_or(false)
    }

    /// Sets a gate (tests, embedding).
    pub fn set(&mut self, feature: Feature, value: bool) {
        if let Some(slot) = self.enabled.get_mut(feature.index()) {
            *slot = value;
        }
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Feature::ALL
            .iter()
            .map(|g| format!("{g}={}", self.enabled(*g)))
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
        assert!(!g.enabled(Feature::APIResponseCompression));
        assert!(g.enabled(Feature::CBORServingAndStorage));
        assert!(g.enabled(Feature::ListFromCacheSnapshot));
        assert!(!FeatureGates::default().enabled(Feature::WatchList));
        assert!(FeatureGates::parse("").unwrap() == FeatureGates::default());
        assert!(
            FeatureGates::parse("NoSuchGate=true")
                .unwrap_err()
                .contains("unrecognized feature gate: NoSuchGate")
        );
        assert!(FeatureGates::parse("WatchList").is_err());
        assert!(FeatureGates::parse("WatchList=yes").is_err());
        // Names are exact: a differently-cased one is unknown, not silently false.
        assert!(FeatureGates::parse("watchlist=true").is_err());
    }

    #[test]
    fn names_round_trip_and_defaults_match_the_spec() {
        for f in Feature::ALL {
            assert_eq!(Feature::from_name(f.name()), Some(f));
            assert_eq!(Feature::ALL[f.index()], f, "ALL is in declaration order");
        }
        let on: Vec<&str> = Feature::ALL
            .iter()
            .filter(|f| f.default_enabled())
            .map(|f| f.name())
            .collect();
        assert_eq!(
            on,
            [
                "APIResponseCompression",
                "DeclarativeValidation",
                "ListFromCacheSnapshot"
            ]
        );
        let g = FeatureGates::parse("WatchList=true").unwrap();
        assert!(g.to_string().contains("WatchList=true"));
        assert_eq!(FeatureGates::parse(&g.to_string()).unwrap(), g);
    }
}
