//! `EgressSelectorConfiguration` (`apiserver.svc.io/v1beta1`, also `v1` and `v1alpha1`): how
//! the server dials out per kind of connection (`controlplane` for webhooks, `etcd` for its
//! store, `cluster`), directly or through an HTTP CONNECT tunnel server over TCP or a Unix
//! socket. The rules are Kubernetes' (`ValidateEgressSelectorConfiguration`), with the
//! field paths of this document rather than Kubernetes' fixed `service.connection`.

use serde::{Deserialize, Serialize};

use super::{ConfigKind, Path};
use svc_core::validation::ErrorList;

/// The selection names; `master` is the deprecated name of `controlplane`.
pub const SELECTION_NAMES: &[&str] = &["cluster", "controlplane", "etcd", "master"];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressSelectorConfiguration {
    #[serde(default)]
    pub egress_selections: Vec<EgressSelection>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressSelection {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub connection: Connection,
}

/// Which connections a selection covers, with `master` read as `controlplane`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selection {
    ControlPlane,
    Etcd,
    Cluster,
}

impl Selection {
    /// The selection a `name` means (case-insensitive, as Kubernetes compares them).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "controlplane" | "master" => Some(Selection::ControlPlane),
            "etcd" => Some(Selection::Etcd),
            "cluster" => Some(Selection::Cluster),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Selection::ControlPlane => "controlplane",
            Selection::Etcd => "etcd",
            Selection::Cluster => "cluster",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    #[serde(default)]
    pub proxy_protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

pub const PROTOCOL_DIRECT: &str = "Direct";
pub const PROTOCOL_HTTP_CONNECT: &str = "HTTPConnect";
pub const PROTOCOL_GRPC: &str = "GRPC";
const PROTOCOLS: &[&str] = &[PROTOCOL_DIRECT, PROTOCOL_GRPC, PROTOCOL_HTTP_CONNECT];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpTransport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uds: Option<UdsTransport>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpTransport {
    #[serde(default)]
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<TlsConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UdsTransport {
    #[serde(default)]
    pub uds_name: String,
}

/// File paths; the files are read by whoever dials (core reads no files).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_bundle: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_cert: String,
}

impl ConfigKind for EgressSelectorConfiguration {
    const API_VERSIONS: &'static [&'static str] = &[
        "apiserver.svc.io/v1beta1",
        "apiserver.svc.io/v1",
        "apiserver.svc.io/v1alpha1",
    ];
    const KIND: &'static str = "EgressSelectorConfiguration";

    fn validate(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        let list = Path::root("egressSelections");
        let mut seen = Vec::new();
        for (i, selection) in self.egress_selections.iter().enumerate() {
            let at = list.index(i);
            let name = at.child("name");
            if selection.name.is_empty() {
                errors.required(name.as_str(), "");
            } else if let Some(s) = Selection::from_name(&selection.name) {
                // `master` and `controlplane` are one selection: both given is a duplicate.
                if seen.contains(&s) {
                    errors.duplicate(name.as_str(), &selection.name);
                }
                seen.push(s);
            } else {
                errors.not_supported(name.as_str(), &selection.name, SELECTION_NAMES);
            }
            validate_connection(&selection.connection, &at.child("connection"), &mut errors);
        }
        errors
    }
}

impl EgressSelectorConfiguration {
    /// What this server refuses although the document is valid: `GRPC` tunnels are not
    /// implemented.
    pub fn unsupported_by_server(&self) -> ErrorList {
        let mut errors = ErrorList::default();
        for (i, selection) in self.egress_selections.iter().enumerate() {
            if selection.connection.proxy_protocol == PROTOCOL_GRPC {
                errors.not_supported(
                    Path::root("egressSelections")
                        .index(i)
                        .child("connection")
                        .child("proxyProtocol")
                        .as_str(),
                    PROTOCOL_GRPC,
                    &[PROTOCOL_DIRECT, PROTOCOL_HTTP_CONNECT],
                );
            }
        }
        errors
    }

    /// The selection named `which` (with `master` read as `controlplane`), if configured.
    pub fn selection(&self, which: Selection) -> Option<&EgressSelection> {
        self.egress_selections
            .iter()
            .find(|s| Selection::from_name(&s.name) == Some(which))
    }
}

fn validate_connection(c: &Connection, at: &Path, errors: &mut ErrorList) {
    let transport = at.child("transport");
    match c.proxy_protocol.as_str() {
        "" => errors.required(at.child("proxyProtocol").as_str(), ""),
        PROTOCOL_DIRECT => {
            if c.transport.is_some() {
                errors.invalid(
                    transport.as_str(),
                    "direct",
                    "must be absent for a Direct connection",
                );
            }
        }
        PROTOCOL_HTTP_CONNECT => match &c.transport {
            None => errors.required(transport.as_str(), "transport must be set for HTTPConnect"),
            Some(t) => validate_transport(t, &transport, errors),
        },
        PROTOCOL_GRPC => match &c.transport {
            None => errors.required(transport.as_str(), "transport must be set for GRPC"),
            Some(t) => {
                if t.tcp.is_some() {
                    errors.invalid(
                        transport.child("tcp").as_str(),
                        "tcp",
                        "Using TCP is not supported for GRPC",
                    );
                } else if let Some(uds) = &t.uds {
                    validate_uds(uds, &transport.child("uds"), errors);
                } else {
                    errors.required(transport.child("uds").as_str(), "UDS must be set with GRPC");
                }
            }
        },
        other => errors.not_supported(at.child("proxyProtocol").as_str(), other, PROTOCOLS),
    }
}

fn validate_transport(t: &Transport, at: &Path, errors: &mut ErrorList) {
    match (&t.tcp, &t.uds) {
        (Some(_), Some(_)) => errors.invalid(
            at.child("tcp").as_str(),
            "tcp",
            "tcp and uds cannot both be set",
        ),
        (None, None) => errors.required(at.child("tcp").as_str(), "one of tcp or uds must be set"),
        (Some(tcp), None) => validate_tcp(tcp, &at.child("tcp"), errors),
        (None, Some(uds)) => validate_uds(uds, &at.child("uds"), errors),
    }
}

fn validate_uds(uds: &UdsTransport, at: &Path, errors: &mut ErrorList) {
    let name = at.child("udsName");
    if uds.uds_name.is_empty() {
        errors.required(name.as_str(), "");
    } else if uds.uds_name.starts_with("unix://") {
        errors.invalid(
            name.as_str(),
            &uds.uds_name,
            "the socket name is written without the unix:// prefix",
        );
    }
}

fn validate_tcp(tcp: &TcpTransport, at: &Path, errors: &mut ErrorList) {
    let tls = at.child("tlsConfig");
    if tcp.url.is_empty() {
        errors.required(at.child("url").as_str(), "");
    } else if tcp.url.starts_with("http://") {
        // Plain HTTP to the tunnel server: nothing of TLS may be configured.
        if let Some(cfg) = &tcp.tls_config {
            for (field, value) in [
                ("caBundle", &cfg.ca_bundle),
                ("clientCert", &cfg.client_cert),
                ("clientKey", &cfg.client_key),
            ] {
                if !value.is_empty() {
                    errors.invalid(
                        tls.child(field).as_str(),
                        value,
                        "must be empty when url starts with http://",
                    );
                }
            }
        }
    } else if tcp.url.starts_with("https://") {
        match &tcp.tls_config {
            None => errors.required(
                tls.as_str(),
                "clientCert and clientKey are required when url starts with https://",
            ),
            Some(cfg) => {
                if cfg.client_cert.is_empty() {
                    errors.required(tls.child("clientCert").as_str(), "");
                }
                if cfg.client_key.is_empty() {
                    errors.required(tls.child("clientKey").as_str(), "");
                }
            }
        }
    } else {
        errors.invalid(
            at.child("url").as_str(),
            &tcp.url,
            "supported connection protocols are http:// and https://",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;

    fn doc(selections: &str) -> String {
        format!(
            "apiVersion: apiserver.svc.io/v1beta1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n{selections}"
        )
    }

    fn errors(selections: &str) -> Vec<String> {
        match load::<EgressSelectorConfiguration>(doc(selections).as_bytes()) {
            Ok(_) => Vec::new(),
            Err(e) => e.lines(),
        }
    }

    #[test]
    fn valid_documents_load() {
        let ok = "- name: controlplane\n  connection:\n    proxyProtocol: HTTPConnect\n    \
                  transport:\n      tcp:\n        url: https://proxy:8131\n        tlsConfig:\n          \
                  caBundle: /ca.pem\n          clientCert: /c.pem\n          clientKey: /k.pem\n\
                  - name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                  tcp:\n        url: http://proxy:8132\n\
                  - name: cluster\n  connection:\n    proxyProtocol: Direct\n";
        let cfg = load::<EgressSelectorConfiguration>(doc(ok).as_bytes()).unwrap();
        assert_eq!(cfg.egress_selections.len(), 3);
        assert!(cfg.unsupported_by_server().is_empty());
        let cp = cfg.selection(Selection::ControlPlane).unwrap();
        let tcp = cp
            .connection
            .transport
            .as_ref()
            .unwrap()
            .tcp
            .as_ref()
            .unwrap();
        assert_eq!(tcp.tls_config.as_ref().unwrap().client_key, "/k.pem");
        // `master` is `controlplane`; a UDS transport; every version decodes.
        for version in EgressSelectorConfiguration::API_VERSIONS {
            let text = format!(
                "apiVersion: {version}\nkind: EgressSelectorConfiguration\negressSelections:\n\
                 - name: master\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                 uds:\n        udsName: /run/konn.sock\n"
            );
            let cfg = load::<EgressSelectorConfiguration>(text.as_bytes()).unwrap();
            assert!(
                cfg.selection(Selection::ControlPlane).is_some(),
                "{version}"
            );
            assert!(cfg.selection(Selection::Etcd).is_none());
        }
    }

    #[test]
    fn every_tls_rule_names_its_path() {
        let tcp = |url: &str, tls: &str| {
            errors(&format!(
                "- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                 tcp:\n        url: {url}\n{tls}"
            ))
        };
        let at = "egressSelections[0].connection.transport.tcp";
        assert_eq!(
            tcp(
                "https://p:1",
                "        tlsConfig:\n          clientKey: /k\n"
            ),
            [format!("{at}.tlsConfig.clientCert: Required value")]
        );
        assert_eq!(
            tcp(
                "https://p:1",
                "        tlsConfig:\n          clientCert: /c\n"
            ),
            [format!("{at}.tlsConfig.clientKey: Required value")]
        );
        assert_eq!(
            tcp("https://p:1", ""),
            [format!(
                "{at}.tlsConfig: Required value: clientCert and clientKey are required when url \
                 starts with https://"
            )]
        );
        let plain = tcp(
            "http://p:1",
            "        tlsConfig:\n          caBundle: /ca\n          clientCert: /c\n          \
             clientKey: /k\n",
        );
        assert_eq!(plain.len(), 3, "{plain:?}");
        for (line, field) in plain.iter().zip(["caBundle", "clientCert", "clientKey"]) {
            assert!(
                line.starts_with(&format!("{at}.tlsConfig.{field}: Invalid value"))
                    && line.ends_with("must be empty when url starts with http://"),
                "{line}"
            );
        }
        assert_eq!(
            tcp("ftp://p:1", ""),
            [format!(
                "{at}.url: Invalid value: \"ftp://p:1\": supported connection protocols are \
                 http:// and https://"
            )]
        );
    }

    #[test]
    fn connection_and_name_rules() {
        let cases: &[(&str, &str)] = &[
            (
                "- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n",
                "egressSelections[0].connection.transport: Required value",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport: {}\n",
                "egressSelections[0].connection.transport.tcp: Required value",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                 tcp: {url: 'http://p:1'}\n      uds: {udsName: /s}\n",
                "egressSelections[0].connection.transport.tcp: Invalid value",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                 uds: {}\n",
                "egressSelections[0].connection.transport.uds.udsName: Required value",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: Direct\n    transport:\n      \
                 uds: {udsName: /s}\n",
                "egressSelections[0].connection.transport: Invalid value",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: Carrier\n",
                "egressSelections[0].connection.proxyProtocol: Unsupported value: \"Carrier\"",
            ),
            (
                "- name: etcd\n  connection: {}\n",
                "egressSelections[0].connection.proxyProtocol: Required value",
            ),
            (
                "- name: nodes\n  connection:\n    proxyProtocol: Direct\n",
                "egressSelections[0].name: Unsupported value: \"nodes\"",
            ),
            (
                "- connection:\n    proxyProtocol: Direct\n",
                "egressSelections[0].name: Required value",
            ),
            (
                "- name: master\n  connection:\n    proxyProtocol: Direct\n\
                 - name: controlplane\n  connection:\n    proxyProtocol: Direct\n",
                "egressSelections[1].name: Duplicate value: \"controlplane\"",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: GRPC\n    transport:\n      \
                 tcp: {url: 'http://p:1'}\n",
                "egressSelections[0].connection.transport.tcp: Invalid value: \"tcp\": Using TCP \
                 is not supported for GRPC",
            ),
            (
                "- name: etcd\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      \
                 tcp: {url: 'http://p:1', proxy: x}\n",
                "egressSelections[0].connection.transport.tcp.proxy: unknown field \"proxy\"",
            ),
        ];
        for (selections, want) in cases {
            let got = errors(selections);
            assert_eq!(got.len(), 1, "{selections}: {got:?}");
            assert!(got[0].starts_with(want), "{selections}: {got:?}");
        }
    }

    #[test]
    fn grpc_is_valid_over_uds_but_refused_by_this_server() {
        let text = doc(
            "- name: etcd\n  connection:\n    proxyProtocol: GRPC\n    transport:\n      \
             uds:\n        udsName: /run/t.sock\n",
        );
        let cfg = load::<EgressSelectorConfiguration>(text.as_bytes()).unwrap();
        let refused = cfg.unsupported_by_server();
        assert_eq!(refused.0.len(), 1);
        assert_eq!(
            refused.0[0].field,
            "egressSelections[0].connection.proxyProtocol"
        );
        assert!(refused.0[0].message.contains("\"GRPC\""));
    }
}
