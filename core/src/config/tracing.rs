//! `TracingConfiguration` (`apiserver.svc.io/v1beta1`, `v1alpha1`, `v1`): where the API server
//! reports traces, and how many spans per million it samples.

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Path};
use crate::validation::ErrorList;

/// The collector Kubernetes reports to when `endpoint` is unset: OTLP over gRPC.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";
/// The largest `samplingRatePerMillion`: every span.
pub const MAX_SAMPLING_RATE_PER_MILLION: i32 = 1_000_000;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TracingConfiguration {
    /// Collector address (insecure, no TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Spans sampled per million; unset follows the parent span's decision, otherwise never
    /// samples, which no value expresses, so it has no default.
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

    /// component-base's `ValidateTracingConfiguration`.
    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        if let Some(rate) = self.sampling_rate_per_million {
            let path = Path::root("samplingRatePerMillion");
            if rate < 0 {
                errors.invalid(
                    path.as_str(),
                    &rate.to_string(),
                    "sampling rate must be positive",
                );
            } else if rate > MAX_SAMPLING_RATE_PER_MILLION {
                errors.invalid(
                    path.as_str(),
                    &rate.to_string(),
                    "sampling rate per million must be less than or equal to one million",
                );
            }
        }
        if let Some(endpoint) = &self.endpoint
            && let Err(e) = check_endpoint(endpoint)
        {
            errors.invalid("endpoint", endpoint, &e);
        }
        errors
    }

    fn apply_defaults(&mut self) {
        self.endpoint
            .get_or_insert_with(|| DEFAULT_ENDPOINT.to_string());
    }
}

/// A gRPC target: `host:port`, `[v6]:port`, or `scheme://authority[/path]`. Kubernetes
/// parses it as a URL after prefixing `dns://` when it has no `//`.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint.is_empty() {
        return Err("must not be empty when set".into());
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("must not contain spaces or control characters".into());
    }
    let rest = match endpoint.split_once("//") {
        Some((scheme, rest)) => {
            let scheme = scheme.strip_suffix(':').unwrap_or(scheme);
            let valid = scheme.is_empty()
                || (scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')));
            if !valid {
                return Err(format!(
                    "first path segment in URL cannot contain colon: {scheme:?}"
                ));
            }
            rest
        }
        None => endpoint,
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.starts_with('[') && !authority.contains(']') {
        return Err("missing ']' in host".into());
    }
    Ok(())
}
