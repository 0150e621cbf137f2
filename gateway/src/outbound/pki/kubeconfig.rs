//! The admin kubeconfig: a fixed YAML template rather than a serializer, since the shape
//! never changes and every value is written as a JSON string literal, which is also a valid
//! YAML double-quoted scalar (so no value can break the document).

use base64::Engine as _;

/// Names inside the kubeconfig; kubectl shows them in `config get-contexts`.
pub(super) const CLUSTER_NAME: &str = "svc";
pub(super) const USER_NAME: &str = "admin";
pub(super) const CONTEXT_NAME: &str = "admin@svc";

pub(super) fn render(server_url: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let q = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {cluster}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {context}
  context:
    cluster: {cluster}
    user: {user}
current-context: {context}
preferences: {{}}
",
        cluster = q(CLUSTER_NAME),
        user = q(USER_NAME),
        context = q(CONTEXT_NAME),
        server = q(server_url),
        ca = q(&b64(ca_pem)),
        cert = q(&b64(cert_pem)),
        key = q(&b64(key_pem)),
    )
}
