//! The signing controller (Kubernetes' `csrsigning`): for the three built-in signers, an
//! approved request that has neither failed nor been issued gets its certificate from the
//! signing CA through `/status`, valid for `expirationSeconds` up to
//! `--cluster-signing-duration`. A request the signer's rules refuse (subject, names or
//! usages) gets a `Failed` condition instead. Requests for other signers are left alone.

use std::sync::Arc;
use std::time::Duration;

use svc_core::ApiError;
use svc_core::kinds::certificate_signing_request::{
    CONDITION_APPROVED, CONDITION_FAILED, SIGNER_AGENT_SERVING, SIGNER_APISERVER_CLIENT,
    SIGNER_APISERVER_CLIENT_AGENT, SUBRESOURCE_STATUS, parse_request,
};
use svc_core::kinds::{CertificateSigningRequest, CertificateSigningRequestCondition};
use svc_core::meta::Time;

use super::{CsrController, Synced, lost_race, subresource_path};
use crate::outbound::pki::{CertificateRequestInfo, Pki, inspect_request};
use crate::serve::app::ServerState;
use crate::serve::loopback::Loopback;

/// The user the controller writes as.
const USER: &str = "system:svc-controller-manager:csr-signer";
/// Certificates are never shorter than this, whatever a request asks (twice the backdating).
const MIN_VALIDITY: Duration = Duration::from_secs(600);
const NODE_ORGANIZATION: &str = "system:nodes";
const NODE_PREFIX: &str = "system:node:";

pub(crate) struct Signer {
    client: Loopback,
    pki: Arc<Pki>,
    max_validity: Duration,
}

impl Signer {
    pub(crate) fn new(app: &Arc<ServerState>, pki: Arc<Pki>) -> Self {
        Signer {
            client: Loopback::controller(app, USER),
            pki,
            max_validity: app.api.opts.cluster_signing_duration,
        }
    }

    /// The certificate for `csr`, or why the signer refuses it.
    fn issue(&self, csr: &CertificateSigningRequest) -> Result<String, String> {
        let der = parse_request(&csr.spec.request)?;
        let info = inspect_request(&der).map_err(|e| e.to_string())?;
        check_signer_rules(&csr.spec.signer_name, &info, &csr.spec.usages)?;
        let validity = validity(csr.spec.expiration_seconds, self.max_validity);
        self.pki
            .sign_request(&der, &csr.spec.usages, validity)
            .map_err(|e| e.to_string())
    }
}

impl CsrController for Signer {
    const NAME: &'static str = "csr-signing-controller";

    async fn sync(&self, csr: &CertificateSigningRequest) -> Result<Synced, ApiError> {
        let status = &csr.status;
        if !status.has_true(CONDITION_APPROVED)
            || status.has_true(CONDITION_FAILED)
            || !status.certificate.is_empty()
            || !is_builtin(&csr.spec.signer_name)
        {
            return Ok(Synced::Nothing);
        }
        let mut next = csr.clone();
        match self.issue(csr) {
            Ok(pem) => next.status.certificate = pem.into_bytes(),
            Err(message) => {
                let now = Some(Time::now());
                next.status
                    .conditions
                    .push(CertificateSigningRequestCondition {
                        type_: CONDITION_FAILED.into(),
                        status: "True".into(),
                        reason: "SignerValidationFailure".into(),
                        message,
                        last_update_time: now,
                        last_transition_time: now,
                    });
            }
        }
        // The resourceVersion read makes the write conditional: of several gateways
        // issuing at once, one wins and the others get 409.
        let path = subresource_path(&csr.metadata.name, SUBRESOURCE_STATUS);
        match self
            .client
            .update(&path, &next)
            .await?
            .into_result::<serde_json::Value>()
        {
            Ok(_) => {
                tracing::info!(request = %csr.metadata.name,
                    issued = !next.status.certificate.is_empty(), "certificate signing request signed");
                Ok(Synced::Wrote)
            }
            Err(e) if lost_race(&e) => Ok(Synced::Wrote),
            Err(e) => Err(e),
        }
    }
}

/// The validity a request gets: what it asks for, within [10 minutes, `max`] (Kubernetes'
/// `signer.duration`).
fn validity(expiration_seconds: Option<i32>, max: Duration) -> Duration {
    match expiration_seconds {
        None => max,
        Some(s) => {
            let asked = Duration::from_secs(u64::try_from(s).unwrap_or(0));
            asked.clamp(MIN_VALIDITY, max.max(MIN_VALIDITY))
        }
    }
}

fn is_builtin(signer: &str) -> bool {
    [
        SIGNER_APISERVER_CLIENT,
        SIGNER_APISERVER_CLIENT_AGENT,
        SIGNER_AGENT_SERVING,
    ]
    .contains(&signer)
}

/// Whether `usages`, as a set, is one of `allowed` (Kubernetes compares sets).
fn usages_are_one_of(usages: &[String], allowed: &[&[&str]]) -> bool {
    allowed.iter().any(|set| {
        usages.iter().all(|u| set.contains(&u.as_str()))
            && set.iter().all(|s| usages.iter().any(|u| u == s))
    })
}

/// Agents' client certificates: with or without key encipherment (RSA or not).
const AGENT_CLIENT_USAGES: &[&[&str]] = &[
    &["digital signature", "key encipherment", "client auth"],
    &["digital signature", "client auth"],
];
const AGENT_SERVING_USAGES: &[&[&str]] = &[
    &["digital signature", "key encipherment", "server auth"],
    &["digital signature", "server auth"],
];

/// Kubernetes' per-signer rules (`signer.go`, `certificates/helpers.go`).
pub(super) fn check_signer_rules(
    signer: &str,
    req: &CertificateRequestInfo,
    usages: &[String],
) -> Result<(), String> {
    match signer {
        SIGNER_APISERVER_CLIENT => {
            for u in usages {
                if !matches!(
                    u.as_str(),
                    "digital signature" | "key encipherment" | "client auth"
                ) {
                    return Err(format!("invalid usage for client certificate: {u}"));
                }
            }
            if !usages.iter().any(|u| u == "client auth") {
                return Err("missing required usage for client certificate: client auth".into());
            }
            Ok(())
        }
        SIGNER_APISERVER_CLIENT_AGENT => {
            if req.organizations != [NODE_ORGANIZATION] {
                return Err("subject organization is not system:nodes".into());
            }
            if !req.dns_names.is_empty() {
                return Err("DNS subjectAltNames are not allowed".into());
            }
            if !req.email_addresses.is_empty() {
                return Err("Email subjectAltNames are not allowed".into());
            }
            if !req.ip_addresses.is_empty() {
                return Err("IP subjectAltNames are not allowed".into());
            }
            if !req.uris.is_empty() {
                return Err("URI subjectAltNames are not allowed".into());
            }
            if !req.common_name.starts_with(NODE_PREFIX) {
                return Err("subject common name does not begin with system:node:".into());
            }
            if !usages_are_one_of(usages, AGENT_CLIENT_USAGES) {
                return Err(
                    "usages did not match [client auth digital signature key encipherment]".into(),
                );
            }
            Ok(())
        }
        SIGNER_AGENT_SERVING => {
            if req.organizations != [NODE_ORGANIZATION] {
                return Err("subject organization is not system:nodes".into());
            }
            if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
                return Err("DNS or IP subjectAltName is required".into());
            }
            if !req.email_addresses.is_empty() {
                return Err("Email subjectAltNames are not allowed".into());
            }
            if !req.uris.is_empty() {
                return Err("URI subjectAltNames are not allowed".into());
            }
            if !usages_are_one_of(usages, AGENT_SERVING_USAGES) {
                return Err(
                    "usages did not match [digital signature key encipherment server auth]".into(),
                );
            }
            if !req.common_name.starts_with(NODE_PREFIX) {
                return Err("subject common name does not begin with system:node:".into());
            }
            Ok(())
        }
        other => Err(format!("unrecognized signerName: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cn: &str) -> CertificateRequestInfo {
        CertificateRequestInfo {
            common_name: cn.into(),
            organizations: vec![NODE_ORGANIZATION.into()],
            ..Default::default()
        }
    }

    fn usages(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_signer_keeps_to_its_rules() {
        let client = CertificateRequestInfo {
            common_name: "jane".into(),
            organizations: vec!["dev".into()],
            ..Default::default()
        };
        let serving = CertificateRequestInfo {
            dns_names: vec!["node-1.example".into()],
            ..node("system:node:node-1")
        };
        let with_ip = CertificateRequestInfo {
            ip_addresses: vec!["10.0.0.1".parse().unwrap()],
            ..node("system:node:node-1")
        };
        let cases: &[(&str, &CertificateRequestInfo, &[&str], Option<&str>)] = &[
            (SIGNER_APISERVER_CLIENT, &client, &["client auth"], None),
            (
                SIGNER_APISERVER_CLIENT,
                &client,
                &["digital signature", "key encipherment", "client auth"],
                None,
            ),
            (
                SIGNER_APISERVER_CLIENT,
                &client,
                &["server auth", "client auth"],
                Some("invalid usage"),
            ),
            (
                SIGNER_APISERVER_CLIENT,
                &client,
                &["digital signature"],
                Some("missing required usage"),
            ),
            (
                SIGNER_APISERVER_CLIENT_AGENT,
                &node("system:node:n1"),
                &["client auth", "digital signature"],
                None,
            ),
            (
                SIGNER_APISERVER_CLIENT_AGENT,
                &node("system:node:n1"),
                &["key encipherment", "client auth", "digital signature"],
                None,
            ),
            (
                SIGNER_APISERVER_CLIENT_AGENT,
                &node("system:node:n1"),
                &["client auth"],
                Some("usages did not match"),
            ),
            (
                SIGNER_APISERVER_CLIENT_AGENT,
                &client,
                &["client auth", "digital signature"],
                Some("organization"),
            ),
            (
                SIGNER_APISERVER_CLIENT_AGENT,
                &node("n1"),
                &["client auth", "digital signature"],
                Some("common name"),
            ),
            (
                SIGNER_APISERVER_CLIENT_AGENT,
                &with_ip,
                &["client auth", "digital signature"],
                Some("IP subjectAltNames"),
            ),
            (
                SIGNER_AGENT_SERVING,
                &serving,
                &["digital signature", "server auth"],
                None,
            ),
            (
                SIGNER_AGENT_SERVING,
                &with_ip,
                &["digital signature", "key encipherment", "server auth"],
                None,
            ),
            (
                SIGNER_AGENT_SERVING,
                &node("system:node:n1"),
                &["digital signature", "server auth"],
                Some("DNS or IP"),
            ),
            (
                SIGNER_AGENT_SERVING,
                &serving,
                &["digital signature", "client auth"],
                Some("usages did not match"),
            ),
            (
                "example.com/custom",
                &client,
                &["client auth"],
                Some("unrecognized"),
            ),
        ];
        for (signer, req, u, want) in cases {
            let got = check_signer_rules(signer, req, &usages(u));
            match want {
                None => assert!(got.is_ok(), "{signer} {u:?}: {got:?}"),
                Some(w) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(w)),
                    "{signer} {u:?}: {got:?}, want {w:?}"
                ),
            }
        }
    }

    #[test]
    fn validity_honours_the_request_within_bounds() {
        let year = Duration::from_secs(8760 * 3600);
        let secs = Duration::from_secs;
        assert_eq!(validity(None, year), year);
        assert_eq!(validity(Some(3600), year), secs(3600));
        assert_eq!(validity(Some(60), year), secs(600));
        assert_eq!(validity(Some(i32::MAX), year), year);
        assert_eq!(validity(Some(-5), year), secs(600));
        assert_eq!(validity(Some(7200), secs(1800)), secs(1800));
    }
}
