//! The client config file (`apiVersion: v1`, `kind: Config`, a "kubeconfig"): clusters,
//! users (certificates, tokens, exec credential plugins), contexts, `current-context` and
//! extensions, with client-go's rules (`clientcmd.Validate`): a server per cluster, a CA file
//! or inline CA but not both and not with `insecure-skip-tls-verify`, a certificate with its
//! key, one of token and basic auth, a complete exec block. Sans-IO: file paths are returned
//! as written, for the caller to resolve against the file's folder and read.
//!
//! `gateway/src/pki/kubeconfig.rs` writes the admin kubeconfig in this shape.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::exec_credential::{self, CLUSTER_EXTENSION};
use super::{ConfigKind, Path};
use svc_core::validation::ErrorList;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferences: Option<Value>,
    #[serde(default)]
    pub clusters: Vec<NamedCluster>,
    #[serde(default)]
    pub users: Vec<NamedUser>,
    #[serde(default)]
    pub contexts: Vec<NamedContext>,
    #[serde(rename = "current-context", default)]
    pub current_context: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<NamedExtension>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedCluster {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub cluster: Cluster,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    #[serde(default)]
    pub server: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tls_server_name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_tls_verify: bool,
    /// A file path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub certificate_authority: String,
    /// Base64 of PEM.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub certificate_authority_data: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub proxy_url: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_compression: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<NamedExtension>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedExtension {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub extension: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedUser {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub user: AuthInfo,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuthInfo {
    #[serde(rename = "client-certificate", default)]
    pub client_certificate: String,
    #[serde(rename = "client-certificate-data", default)]
    pub client_certificate_data: String,
    #[serde(rename = "client-key", default)]
    pub client_key: String,
    #[serde(rename = "client-key-data", default)]
    pub client_key_data: String,
    #[serde(default)]
    pub token: String,
    #[serde(rename = "tokenFile", default)]
    pub token_file: String,
    #[serde(rename = "as", default)]
    pub impersonate: String,
    #[serde(rename = "as-uid", default)]
    pub impersonate_uid: String,
    #[serde(rename = "as-groups", default)]
    pub impersonate_groups: Vec<String>,
    #[serde(rename = "as-user-extra", default)]
    pub impersonate_user_extra: Option<Value>,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
    #[serde(rename = "auth-provider", default)]
    pub auth_provider: Option<Value>,
    #[serde(default)]
    pub exec: Option<ExecConfig>,
    #[serde(default)]
    pub extensions: Vec<NamedExtension>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecConfig {
    #[serde(default)]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<ExecEnvVar>,
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub install_hint: String,
    #[serde(default)]
    pub provide_cluster_info: bool,
    #[serde(default)]
    pub interactive_mode: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecEnvVar {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedContext {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub context: Context,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    #[serde(default)]
    pub cluster: String,
    #[serde(default)]
    pub user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<NamedExtension>,
}

impl ConfigKind for Config {
    const API_VERSIONS: &'static [&'static str] = &["v1"];
    const KIND: &'static str = "Config";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        unique_names(
            "clusters",
            self.clusters.iter().map(|c| c.name.as_str()),
            &mut errors,
        );
        unique_names(
            "users",
            self.users.iter().map(|u| u.name.as_str()),
            &mut errors,
        );
        unique_names(
            "contexts",
            self.contexts.iter().map(|c| c.name.as_str()),
            &mut errors,
        );
        for (i, c) in self.clusters.iter().enumerate() {
            validate_cluster(
                &c.cluster,
                &Path::root("clusters").index(i).child("cluster"),
                &mut errors,
            );
        }
        for (i, u) in self.users.iter().enumerate() {
            validate_user(
                &u.user,
                &Path::root("users").index(i).child("user"),
                &mut errors,
            );
        }
        for (i, c) in self.contexts.iter().enumerate() {
            let at = Path::root("contexts").index(i).child("context");
            if c.context.cluster.is_empty() {
                errors.required(at.child("cluster").as_str(), "");
            } else if !self.clusters.iter().any(|x| x.name == c.context.cluster) {
                errors.invalid(
                    at.child("cluster").as_str(),
                    &c.context.cluster,
                    "no cluster of that name",
                );
            }
            if !c.context.user.is_empty() && !self.users.iter().any(|x| x.name == c.context.user) {
                errors.invalid(
                    at.child("user").as_str(),
                    &c.context.user,
                    "no user of that name",
                );
            }
        }
        if !self.current_context.is_empty()
            && !self.contexts.iter().any(|c| c.name == self.current_context)
        {
            errors.invalid(
                "current-context",
                &self.current_context,
                "no context of that name",
            );
        }
        errors
    }
}

fn unique_names<'a>(list: &str, names: impl Iterator<Item = &'a str>, errors: &mut ErrorList) {
    let mut seen = Vec::new();
    for (i, name) in names.enumerate() {
        let at = Path::root(list).index(i).child("name");
        if name.is_empty() {
            errors.required(at.as_str(), "");
        } else if seen.contains(&name) {
            errors.duplicate(at.as_str(), name);
        }
        seen.push(name);
    }
}

fn validate_base64(value: &str, at: &Path, errors: &mut ErrorList) {
    if !value.is_empty()
        && base64::engine::general_purpose::STANDARD
            .decode(value)
            .is_err()
    {
        errors.invalid(at.as_str(), "<data>", "must be base64");
    }
}

fn validate_cluster(c: &Cluster, at: &Path, errors: &mut ErrorList) {
    if c.server.is_empty() {
        errors.required(at.child("server").as_str(), "");
    } else if !(c.server.starts_with("https://") || c.server.starts_with("http://")) {
        errors.invalid(
            at.child("server").as_str(),
            &c.server,
            "must be an http:// or https:// URL",
        );
    }
    if !c.certificate_authority.is_empty() && !c.certificate_authority_data.is_empty() {
        errors.invalid(
            at.child("certificate-authority").as_str(),
            &c.certificate_authority,
            "certificate-authority and certificate-authority-data may not both be set",
        );
    }
    if c.insecure_skip_tls_verify
        && (!c.certificate_authority.is_empty() || !c.certificate_authority_data.is_empty())
    {
        errors.invalid(
            at.child("insecure-skip-tls-verify").as_str(),
            "true",
            "a certificate authority may not be given with insecure-skip-tls-verify",
        );
    }
    validate_base64(
        &c.certificate_authority_data,
        &at.child("certificate-authority-data"),
        errors,
    );
}

fn validate_user(u: &AuthInfo, at: &Path, errors: &mut ErrorList) {
    for (file, data, f, d) in [
        (
            "client-certificate",
            "client-certificate-data",
            &u.client_certificate,
            &u.client_certificate_data,
        ),
        (
            "client-key",
            "client-key-data",
            &u.client_key,
            &u.client_key_data,
        ),
    ] {
        if !f.is_empty() && !d.is_empty() {
            errors.invalid(
                at.child(file).as_str(),
                f,
                &format!("{file} and {data} may not both be set"),
            );
        }
        validate_base64(d, &at.child(data), errors);
    }
    let has_cert = !u.client_certificate.is_empty() || !u.client_certificate_data.is_empty();
    let has_key = !u.client_key.is_empty() || !u.client_key_data.is_empty();
    if has_cert && !has_key {
        errors.required(
            at.child("client-key").as_str(),
            "client-key or client-key-data is needed with a client certificate",
        );
    }
    if has_key && !has_cert {
        errors.required(
            at.child("client-certificate").as_str(),
            "client-certificate or client-certificate-data is needed with a client key",
        );
    }
    let token = !u.token.is_empty() || !u.token_file.is_empty();
    let basic = !u.username.is_empty() || !u.password.is_empty();
    if token && basic {
        errors.invalid(
            at.child("username").as_str(),
            &u.username,
            "only one of token and basic authentication may be used",
        );
    }
    if let Some(exec) = &u.exec {
        let at = at.child("exec");
        if u.auth_provider.is_some() {
            errors.invalid(at.as_str(), "exec", "may not be given with auth-provider");
        }
        if exec.command.is_empty() {
            errors.required(at.child("command").as_str(), "");
        }
        if exec.api_version.is_empty() {
            errors.required(at.child("apiVersion").as_str(), "");
        } else if !exec_credential::ExecCredential::API_VERSIONS
            .contains(&exec.api_version.as_str())
        {
            errors.not_supported(
                at.child("apiVersion").as_str(),
                &exec.api_version,
                <exec_credential::ExecCredential as ConfigKind>::API_VERSIONS,
            );
        }
        match exec.interactive_mode.as_str() {
            "" | "Never" | "IfAvailable" | "Always" => {}
            other => errors.not_supported(
                at.child("interactiveMode").as_str(),
                other,
                &["Always", "IfAvailable", "Never"],
            ),
        }
        for (i, e) in exec.env.iter().enumerate() {
            if e.name.is_empty() {
                errors.required(at.child("env").index(i).child("name").as_str(), "");
            }
        }
    }
}

/// The cluster and user one context selects.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved<'a> {
    pub cluster: &'a Cluster,
    pub user: Option<&'a AuthInfo>,
}

impl Config {
    /// The cluster and user of `context` (else `current-context`; else the only context).
    pub fn resolve(&self, context: Option<&str>) -> Result<Resolved<'_>, String> {
        let name = context.unwrap_or(&self.current_context);
        let ctx = if name.is_empty() {
            match self.contexts.as_slice() {
                [only] => &only.context,
                [] => return Err("the file has no context".to_string()),
                _ => return Err("current-context is not set and there are several contexts".into()),
            }
        } else {
            &self
                .contexts
                .iter()
                .find(|c| c.name == name)
                .ok_or_else(|| format!("context {name:?} not found"))?
                .context
        };
        let cluster = &self
            .clusters
            .iter()
            .find(|c| c.name == ctx.cluster)
            .ok_or_else(|| format!("cluster {:?} not found", ctx.cluster))?
            .cluster;
        let user = if ctx.user.is_empty() {
            None
        } else {
            Some(
                &self
                    .users
                    .iter()
                    .find(|u| u.name == ctx.user)
                    .ok_or_else(|| format!("user {:?} not found", ctx.user))?
                    .user,
            )
        };
        Ok(Resolved { cluster, user })
    }
}

impl Cluster {
    /// `spec.cluster` of an exec plugin's input, with the `client.authentication.svc.io/exec`
    /// extension as its `config`.
    pub fn exec_info(&self) -> exec_credential::Cluster {
        exec_credential::Cluster {
            server: self.server.clone(),
            tls_server_name: self.tls_server_name.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            certificate_authority_data: self.certificate_authority_data.clone(),
            proxy_url: self.proxy_url.clone(),
            disable_compression: self.disable_compression,
            config: self
                .extensions
                .iter()
                .find(|e| e.name == CLUSTER_EXTENSION)
                .map(|e| e.extension.clone()),
        }
    }
}

/// Decodes a base64 `-data` field (validation has checked it decodes).
pub fn decode_data(data: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    const FULL: &str = r#"apiVersion: v1
kind: Config
preferences: {}
clusters:
- name: hook
  cluster:
    server: https://127.0.0.1:8443/authorize
    certificate-authority-data: Q0E=
    tls-server-name: hook.local
    extensions:
    - name: client.authentication.svc.io/exec
      extension: {audience: hook}
- name: other
  cluster:
    server: http://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: plugin
  user:
    exec:
      apiVersion: client.authentication.svc.io/v1
      command: ./plugin.sh
      args: [--a]
      env: [{name: FOO, value: bar}]
      provideClusterInfo: true
      interactiveMode: Never
- name: cert
  user:
    client-certificate: c.pem
    client-key: k.pem
    token: t
contexts:
- name: main
  context: {cluster: hook, user: plugin}
- name: second
  context: {cluster: other, user: cert, namespace: x}
current-context: main
"#;

    fn errors(text: &str) -> Vec<String> {
        load::<Config>(text.as_bytes()).unwrap_err().lines()
    }

    #[test]
    fn a_full_file_parses_and_resolves_its_current_context() {
        let cfg = load::<Config>(FULL.as_bytes()).unwrap();
        let r = cfg.resolve(None).unwrap();
        assert_eq!(r.cluster.server, "https://127.0.0.1:8443/authorize");
        assert_eq!(decode_data(&r.cluster.certificate_authority_data), b"CA");
        let exec = r.user.unwrap().exec.as_ref().unwrap();
        assert_eq!(exec.command, "./plugin.sh");
        assert!(exec.provide_cluster_info);
        let info = r.cluster.exec_info();
        assert_eq!(info.tls_server_name, "hook.local");
        assert_eq!(info.config, Some(serde_json::json!({"audience": "hook"})));
        let r = cfg.resolve(Some("second")).unwrap();
        assert_eq!(r.user.unwrap().client_key, "k.pem");
        assert!(cfg.resolve(Some("nope")).is_err());
    }

    #[test]
    fn the_admin_kubeconfig_shape_parses() {
        // What gateway/src/pki/kubeconfig.rs writes.
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: \"svc\"\n  cluster:\n    \
                    server: \"https://127.0.0.1:6443\"\n    certificate-authority-data: \"Q0E=\"\n\
                    users:\n- name: \"admin\"\n  user:\n    client-certificate-data: \"Q0U=\"\n    \
                    client-key-data: \"S0U=\"\ncontexts:\n- name: \"admin@svc\"\n  context:\n    \
                    cluster: \"svc\"\n    user: \"admin\"\ncurrent-context: \"admin@svc\"\n\
                    preferences: {}\n";
        let cfg = load::<Config>(text.as_bytes()).unwrap();
        let r = cfg.resolve(None).unwrap();
        assert_eq!(decode_data(&r.user.unwrap().client_key_data), b"KE");
    }

    #[test]
    fn client_go_rules_name_their_paths() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "    server: https://127.0.0.1:8443/authorize\n",
                "",
                "clusters[0].cluster.server: Required value",
            ),
            (
                "    certificate-authority-data: Q0E=\n",
                "    certificate-authority: /ca.pem\n    certificate-authority-data: Q0E=\n",
                "clusters[0].cluster.certificate-authority: Invalid value",
            ),
            (
                "    certificate-authority-data: Q0E=\n",
                "    certificate-authority-data: Q0E=\n    insecure-skip-tls-verify: true\n",
                "clusters[0].cluster.insecure-skip-tls-verify: Invalid value",
            ),
            (
                "    certificate-authority-data: Q0E=\n",
                "    certificate-authority-data: '%%%'\n",
                "clusters[0].cluster.certificate-authority-data: Invalid value",
            ),
            (
                "      command: ./plugin.sh\n",
                "",
                "users[0].user.exec.command: Required value",
            ),
            (
                "      apiVersion: client.authentication.svc.io/v1\n",
                "      apiVersion: client.authentication.svc.io/v2\n",
                "users[0].user.exec.apiVersion: Unsupported value",
            ),
            (
                "      env: [{name: FOO, value: bar}]\n",
                "      env: [{value: bar}]\n",
                "users[0].user.exec.env[0].name: Required value",
            ),
            (
                "    client-key: k.pem\n",
                "",
                "users[1].user.client-key: Required value",
            ),
            (
                "    token: t\n",
                "    token: t\n    username: u\n",
                "users[1].user.username: Invalid value",
            ),
            (
                "current-context: main\n",
                "current-context: gone\n",
                "current-context: Invalid value: \"gone\"",
            ),
            (
                "  context: {cluster: other, user: cert, namespace: x}\n",
                "  context: {cluster: other, user: nobody}\n",
                "contexts[1].context.user: Invalid value",
            ),
            (
                "- name: second\n",
                "- name: main\n",
                "contexts[1].name: Duplicate value",
            ),
            (
                "    tls-server-name: hook.local\n",
                "    tls-server-nam: hook.local\n",
                "clusters[0].cluster.tls-server-nam: unknown field",
            ),
        ];
        for (from, to, want) in cases {
            assert!(FULL.contains(from), "{from}");
            let got = errors(&FULL.replacen(from, to, 1));
            assert_eq!(got.len(), 1, "{want}: {got:?}");
            assert!(got[0].starts_with(want), "{want}: {got:?}");
        }
    }
}
