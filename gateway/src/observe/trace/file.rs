//! The TracingConfiguration file (`--tracing-config-file`): where spans go and how many of
//! the requests that arrive without a sampled parent are traced. The type and its rules are
//! `svc_config::tracing`'s (shared with `validate-config`); here it is read and dialled.

pub use svc_config::tracing::{
    DEFAULT_ENDPOINT, MAX_SAMPLING_RATE_PER_MILLION as PER_MILLION, TracingConfiguration,
};

/// Reads and checks the file of `--tracing-config-file`; the error names the file.
pub fn read(path: &std::path::Path) -> Result<TracingConfiguration, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    svc_config::load::<TracingConfiguration>(&bytes).map_err(|mut e| {
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
        svc_config::load::<TracingConfiguration>(doc.as_bytes()).map_err(|e| e.lines())
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
