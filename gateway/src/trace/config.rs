//! The TracingConfiguration file (`--tracing-config-file`): where spans go and how many of
//! the requests that arrive without a sampled parent are traced. The type lives here until
//! `svc_core::config` has it; the rest of the gateway uses only `read` and `collector_uri`, so
//! moving it is one import.

use serde::{Deserialize, Serialize};
use svc_core::config::{ConfigKind, Path};
use svc_core::validation::ErrorList;

/// The collector Kubernetes' components report to when `endpoint` is unset.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";

/// `samplingRatePerMillion` of 1,000,000 samples every trace.
pub const PER_MILLION: i32 = 1_000_000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TracingConfiguration {
    /// The collector's address, OTLP over gRPC without TLS: `host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Samples per million of the traces started here; unset or 0: only requests whose
    /// incoming parent is sampled are traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_rate_per_million: Option<i32>,
}

impl ConfigKind for TracingConfiguration {
    const API_VERSIONS: &'static [&'static str] = &[
        "apiserver.svc.io/v1beta1",
        "apiserver.svc.io/v1alpha1",
        "apiserver.svc.io/v1",
    ];
    const KIND: &'static str = "TracingConfiguration";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        if let Some(rate) = self.sampling_rate_per_million
            && !(0..=PER_MILLION).contains(&rate)
        {
            // A number, so unquoted, as Kubernetes prints it.
            errors.push(
                Path::root("samplingRatePerMillion").as_str(),
                "FieldValueInvalid",
                format!("Invalid value: {rate}: sampling rate must be between 0 and 1,000,000"),
            );
        }
        if let Some(endpoint) = &self.endpoint
            && let Err(e) = endpoint_uri(endpoint)
        {
            errors.invalid(Path::root("endpoint").as_str(), endpoint, &e);
        }
        errors
    }
}

/// Reads and checks the file of `--tracing-config-file`; the error names the file.
pub fn read(path: &std::path::Path) -> Result<TracingConfiguration, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    svc_core::config::load::<TracingConfiguration>(&bytes).map_err(|mut e| {
        e.subject = path.display().to_string();
        e.to_string()
    })
}

/// The gRPC URI of the collector: `endpoint` (or the default) as `http://host:port`.
pub fn collector_uri(config: &TracingConfiguration) -> Result<String, String> {
    endpoint_uri(config.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT))
}

/// `host:port` as the insecure gRPC URI the exporter dials; an `http://` URI is taken as it is
/// (the connection never uses TLS, so `https://` is refused).
fn endpoint_uri(endpoint: &str) -> Result<String, String> {
    let uri = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let parsed: http::Uri = uri.parse().map_err(|e| format!("{e}"))?;
    if parsed.scheme_str() != Some("http") {
        return Err("the collector is reached without TLS: give host:port".into());
    }
    if parsed.host().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(doc: &str) -> Result<TracingConfiguration, Vec<String>> {
        svc_core::config::load::<TracingConfiguration>(doc.as_bytes()).map_err(|e| e.lines())
    }

    #[test]
    fn decodes_checks_and_defaults_the_endpoint() {
        let c = load(
            "apiVersion: apiserver.svc.io/v1beta1\nkind: TracingConfiguration\n\
             endpoint: 127.0.0.1:4317\nsamplingRatePerMillion: 100\n",
        )
        .unwrap();
        assert_eq!(collector_uri(&c).unwrap(), "http://127.0.0.1:4317");
        assert_eq!(c.sampling_rate_per_million, Some(100));
        let c = load("apiVersion: apiserver.svc.io/v1\nkind: TracingConfiguration\n").unwrap();
        assert_eq!(collector_uri(&c).unwrap(), "http://localhost:4317");

        let errs = load(
            "apiVersion: apiserver.svc.io/v1beta1\nkind: TracingConfiguration\n\
             samplingRatePerMillion: 1000001\nendpoint: https://x:1\nextra: 1\n",
        )
        .unwrap_err();
        assert_eq!(errs, vec!["extra: unknown field \"extra\"".to_string()]);
        let errs = load(
            "apiVersion: apiserver.svc.io/v1beta1\nkind: TracingConfiguration\n\
             samplingRatePerMillion: -1\nendpoint: https://x:1\n",
        )
        .unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("samplingRatePerMillion: Invalid value: -1"));
        assert!(errs[1].starts_with("endpoint: Invalid value: \"https://x:1\""));
    }
}
