//! `ExecCredential` (`client.authentication.svc.io/v1` and `v1beta1`, identical fields): what
//! a client gives an exec credential plugin (`spec`, in the `SVC_EXEC_INFO` environment
//! variable) and what the plugin prints back (`status`: a bearer token, or a client
//! certificate and key, with an optional expiry). [`ExecCredential::parse_output`] checks a
//! plugin's answer as client-go does: the `apiVersion` it was asked for, a `status`, and a
//! token or a complete certificate and key pair.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{ConfigError, ConfigKind, Path};
use svc_core::validation::ErrorList;

/// The environment variable carrying the plugin's input (Kubernetes names it
/// `KUBERNETES_EXEC_INFO`).
pub const INFO_ENV: &str = "SVC_EXEC_INFO";
/// The kubeconfig cluster extension whose value becomes `spec.cluster.config`.
pub const CLUSTER_EXTENSION: &str = "client.authentication.svc.io/exec";
pub const V1: &str = "client.authentication.svc.io/v1";
pub const V1BETA1: &str = "client.authentication.svc.io/v1beta1";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecCredential {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub spec: ExecCredentialSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ExecCredentialStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecCredentialSpec {
    /// Set only when the kubeconfig's exec block has `provideClusterInfo: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
    #[serde(default)]
    pub interactive: bool,
}

/// The cluster the credential is for, as the plugin sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    #[serde(default)]
    pub server: String,
    #[serde(
        rename = "tls-server-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub tls_server_name: String,
    #[serde(
        rename = "insecure-skip-tls-verify",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub insecure_skip_tls_verify: bool,
    /// Base64 of the PEM, as Go writes `[]byte`.
    #[serde(
        rename = "certificate-authority-data",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub certificate_authority_data: String,
    #[serde(
        rename = "proxy-url",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub proxy_url: String,
    #[serde(
        rename = "disable-compression",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub disable_compression: bool,
    /// The `client.authentication.svc.io/exec` extension of the kubeconfig cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecCredentialStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_certificate_data: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_key_data: String,
}

impl ConfigKind for ExecCredential {
    const API_VERSIONS: &'static [&'static str] = &[V1, V1BETA1];
    const KIND: &'static str = "ExecCredential";

    /// A plugin's output: a status holding a token or a certificate and key pair, and a
    /// readable expiry.
    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let Some(status) = &self.status else {
            errors.required("status", "the plugin returned no credential");
            return errors;
        };
        let at = Path::root("status");
        let cert = !status.client_certificate_data.is_empty();
        let key = !status.client_key_data.is_empty();
        match (cert, key) {
            (true, false) => errors.required(
                at.child("clientKeyData").as_str(),
                "clientCertificateData needs its key",
            ),
            (false, true) => errors.required(
                at.child("clientCertificateData").as_str(),
                "clientKeyData needs its certificate",
            ),
            (false, false) if status.token.is_empty() => errors.required(
                at.child("token").as_str(),
                "a token or clientCertificateData and clientKeyData",
            ),
            _ => {}
        }
        if let Some(t) = &status.expiration_timestamp
            && OffsetDateTime::parse(t, &Rfc3339).is_err()
        {
            errors.invalid(
                at.child("expirationTimestamp").as_str(),
                t,
                "must be an RFC 3339 time",
            );
        }
        errors
    }
}

impl ExecCredential {
    /// The input given to a plugin: `interactive` is always false (the server has no
    /// terminal), `cluster` only when asked for.
    pub fn input(api_version: &str, cluster: Option<Cluster>) -> Self {
        ExecCredential {
            api_version: api_version.to_string(),
            kind: Self::KIND.to_string(),
            spec: ExecCredentialSpec {
                cluster,
                interactive: false,
            },
            status: None,
        }
    }

    /// Checks a plugin's stdout: an `ExecCredential` of exactly `api_version` (the one the
    /// kubeconfig asked for), no unknown field, and a usable status.
    pub fn parse_output(out: &[u8], api_version: &str) -> Result<Self, ConfigError> {
        let doc: Value = serde_json::from_slice(out).map_err(|e| {
            let mut errors = ErrorList::default();
            errors.push(
                "",
                "FieldValueInvalid",
                format!("the output is not JSON: {e}"),
            );
            ConfigError::new(Self::KIND, errors)
        })?;
        let got = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !got.is_empty() && got != api_version {
            let mut errors = ErrorList::default();
            errors.invalid(
                "apiVersion",
                got,
                &format!("does not match the requested {api_version}"),
            );
            return Err(ConfigError::new(Self::KIND, errors));
        }
        super::load_value(doc)
    }

    /// `status.expirationTimestamp` as a time (validation has checked it parses).
    pub fn expiry(&self) -> Option<OffsetDateTime> {
        let t = self.status.as_ref()?.expiration_timestamp.as_ref()?;
        OffsetDateTime::parse(t, &Rfc3339).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn out(api: &str, status: Value) -> Vec<u8> {
        json!({"apiVersion": api, "kind": "ExecCredential", "status": status})
            .to_string()
            .into_bytes()
    }

    fn refusal(bytes: &[u8], api: &str) -> Vec<String> {
        ExecCredential::parse_output(bytes, api)
            .unwrap_err()
            .lines()
    }

    #[test]
    fn a_token_or_a_certificate_pair_is_accepted_in_both_versions() {
        for api in [V1, V1BETA1] {
            let c = ExecCredential::parse_output(
                &out(
                    api,
                    json!({"token": "abc", "expirationTimestamp": "2030-01-02T03:04:05Z"}),
                ),
                api,
            )
            .unwrap();
            assert_eq!(c.status.as_ref().unwrap().token, "abc");
            assert_eq!(c.expiry().unwrap().unix_timestamp(), 1_893_553_445);
            let c = ExecCredential::parse_output(
                &out(
                    api,
                    json!({"clientCertificateData": "C", "clientKeyData": "K"}),
                ),
                api,
            )
            .unwrap();
            let st = c.status.unwrap();
            assert_eq!(
                (st.client_certificate_data.as_str(), st.token.as_str()),
                ("C", "")
            );
        }
    }

    #[test]
    fn bad_output_is_refused_naming_the_field() {
        assert_eq!(
            refusal(&out(V1BETA1, json!({"token": "t"})), V1),
            [format!(
                "apiVersion: Invalid value: \"{V1BETA1}\": does not match the requested {V1}"
            )]
        );
        let no_status = json!({"apiVersion": V1, "kind": "ExecCredential"}).to_string();
        assert_eq!(
            refusal(no_status.as_bytes(), V1),
            ["status: Required value: the plugin returned no credential"]
        );
        assert!(refusal(&out(V1, json!({})), V1)[0].starts_with("status.token: Required value"));
        assert!(
            refusal(&out(V1, json!({"clientCertificateData": "C"})), V1)[0]
                .starts_with("status.clientKeyData: Required value")
        );
        assert!(
            refusal(&out(V1, json!({"clientKeyData": "K"})), V1)[0]
                .starts_with("status.clientCertificateData: Required value")
        );
        assert!(
            refusal(
                &out(V1, json!({"token": "t", "expirationTimestamp": "tomorrow"})),
                V1
            )[0]
            .starts_with("status.expirationTimestamp: Invalid value")
        );
        assert!(
            refusal(&out(V1, json!({"token": "t", "tokn": "x"})), V1)[0]
                .starts_with("status.tokn: unknown field")
        );
        let wrong_kind = json!({"apiVersion": V1, "kind": "Pod", "status": {"token": "t"}});
        assert!(refusal(wrong_kind.to_string().as_bytes(), V1)[0].starts_with("kind:"));
        assert!(refusal(b"not json", V1)[0].contains("not JSON"));
    }

    #[test]
    fn the_input_is_non_interactive_and_carries_the_cluster_only_when_given() {
        let plain = serde_json::to_value(ExecCredential::input(V1, None)).unwrap();
        assert_eq!(
            plain,
            json!({"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": false}})
        );
        let cluster = Cluster {
            server: "https://h:1".into(),
            certificate_authority_data: "Q0E=".into(),
            config: Some(json!({"audience": "x"})),
            ..Default::default()
        };
        let with = serde_json::to_value(ExecCredential::input(V1BETA1, Some(cluster))).unwrap();
        assert_eq!(
            with["spec"]["cluster"],
            json!({"server": "https://h:1", "certificate-authority-data": "Q0E=",
                   "config": {"audience": "x"}})
        );
    }
}
