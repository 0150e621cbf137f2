//! `TracingConfiguration` (`apiserver.svc.io/v1beta1`, `v1alpha1`, `v1`): where the API server
//! reports traces, and how many spans per million it samples.

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Path};
use svc_core::validation::ErrorList;

/// The collector Kubernetes reports to when `endpoint` is unset: OTLP over gRPC.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";
/// The largest `samplingRatePerMillion`: every span.
pub const MAX_SAMPLING_RATE_PER_MILLION: i32 = 1_000_000;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TracingConfiguration {
    /// The collector's address, OTLP over gRPC without TLS: `host:port` (or `http://host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Samples per million of the traces started here; unset or 0: only requests whose
    /// incoming parent is sampled are traced. Unset has no value to default to.
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

    /// component-base's `ValidateTracingConfiguration`, and an endpoint the server can dial.
    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        if let Some(rate) = self.sampling_rate_per_million {
            let detail = if rate < 0 {
                "sampling rate must be positive"
            } else {
                "sampling rate per million must be less than or equal to one million"
            };
            if !(0..=MAX_SAMPLING_RATE_PER_MILLION).contains(&rate) {
                // A number, so unquoted, as Kubernetes prints it.
                errors.push(
                    Path::root("samplingRatePerMillion").as_str(),
                    "FieldValueInvalid",
                    format!("Invalid value: {rate}: {detail}"),
                );
            }
        }
        if let Some(endpoint) = &self.endpoint
            && let Err(e) = check_endpoint(endpoint)
        {
            errors.invalid(Path::root("endpoint").as_str(), endpoint, &e);
        }
        errors
    }

    fn apply_defaults(&mut self) {
        self.endpoint
            .get_or_insert_with(|| DEFAULT_ENDPOINT.to_string());
    }
}

/// `host:port`, `[v6]:port`, or the same after `http://`: the collector is dialled without
/// TLS, so any other scheme is refused.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("must not contain spaces or control characters".into());
    }
    let rest = match endpoint.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => return Err("the collector is reached without TLS: give host:port".into()),
        None => endpoint,
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = if let Some(v6) = authority.strip_prefix('[') {
        let Some((host, _)) = v6.split_once(']') else {
            return Err("missing ']' in host".into());
        };
        host
    } else {
        authority.split(':').next().unwrap_or_default()
    };
    if host.is_empty() {
        return Err("must name a host".into());
    }
    Ok(())
}
