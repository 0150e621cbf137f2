//! The approving controller (Kubernetes' `csrapproving`, `sarapprove.go`): a pending
//! request for `svc.io/apiserver-client-agent` that is shaped like a node agent's client
//! certificate (CN `system:node:<name>`, O `system:nodes` only, no alternative names, the
//! agent client usages) is approved through `/approval` when its requester may ask for it:
//! the node itself (`selfnodeclient`: the requester is the CN, in `system:nodes`) or a
//! bootstrap user (`nodeclient`: in `system:bootstrappers`), or whoever the authorizer
//! allows to create those subresources. Nothing else is ever approved automatically.

use std::sync::Arc;

use svc_core::kinds::certificate_signing_request::{
    CONDITION_APPROVED, CONDITION_DENIED, SIGNER_APISERVER_CLIENT_AGENT, SUBRESOURCE_APPROVAL,
    parse_request,
};
use svc_core::kinds::{CertificateSigningRequest, CertificateSigningRequestCondition};
use svc_core::{ApiError, Resource};

use super::signer::check_signer_rules;
use super::{CsrController, Synced, lost_race, subresource_path};
use crate::outbound::pki::inspect_request;
use crate::security::authz::{Attributes, Chain, ResourceAccess};
use crate::security::state::Security;
use crate::serve::app::ServerState;
use crate::serve::loopback::Loopback;
use svc_core::user::UserInfo;

/// The user the controller writes as.
const USER: &str = "system:svc-controller-manager:csr-approver";
/// The group of node agents, and the group of the users agents bootstrap with.
const GROUP_NODES: &str = "system:nodes";
const GROUP_BOOTSTRAPPERS: &str = "system:bootstrappers";

pub(crate) struct Approver {
    /// Whose authorizers judge a requester.
    security: Arc<Security>,
    client: Loopback,
}

impl Approver {
    pub(crate) fn new(app: &Arc<ServerState>, security: Arc<Security>) -> Self {
        Approver {
            security,
            client: Loopback::controller(app, USER),
        }
    }
}

/// How a request may be approved: the permission it needs, and the group that has it.
struct Recognizer {
    subresource: &'static str,
    group: &'static str,
    message: &'static str,
}

const SELF_NODE_CLIENT: Recognizer = Recognizer {
    subresource: "selfnodeclient",
    group: GROUP_NODES,
    message: "Auto approving self agent client certificate after authorization.",
};
const NODE_CLIENT: Recognizer = Recognizer {
    subresource: "nodeclient",
    group: GROUP_BOOTSTRAPPERS,
    message: "Auto approving agent client certificate after authorization.",
};

/// Whether the requester recorded in `csr` holds `r`'s permission: by its group, or as the
/// authorizer decides for `create` on `certificatesigningrequests/<subresource>`.
async fn requester_may(
    authorizer: &Chain,
    csr: &CertificateSigningRequest,
    r: &Recognizer,
) -> bool {
    let spec = &csr.spec;
    if spec.groups.iter().any(|g| g == r.group) {
        return true;
    }
    let requester = UserInfo {
        username: spec.username.clone(),
        uid: spec.uid.clone(),
        groups: spec.groups.clone(),
        extra: spec.extra.clone(),
    };
    let attrs = Attributes {
        verb: "create",
        resource: Some(ResourceAccess {
            group: CertificateSigningRequest::INFO.group,
            version: CertificateSigningRequest::INFO.version,
            resource: CertificateSigningRequest::INFO.plural,
            subresource: Some(r.subresource),
            namespace: "",
            name: None,
        }),
        path: "",
    };
    authorizer.authorize(&requester, &attrs).await.is_ok()
}

/// The message to approve `csr` with, or `None` when it is not approved automatically.
async fn approval(authorizer: &Chain, csr: &CertificateSigningRequest) -> Option<&'static str> {
    if csr.spec.signer_name != SIGNER_APISERVER_CLIENT_AGENT {
        return None;
    }
    let der = parse_request(&csr.spec.request).ok()?;
    let req = inspect_request(&der).ok()?;
    // The agent client shape: the signer's own rules for this signer.
    check_signer_rules(SIGNER_APISERVER_CLIENT_AGENT, &req, &csr.spec.usages).ok()?;
    if csr.spec.username == req.common_name
        && requester_may(authorizer, csr, &SELF_NODE_CLIENT).await
    {
        return Some(SELF_NODE_CLIENT.message);
    }
    requester_may(authorizer, csr, &NODE_CLIENT)
        .await
        .then_some(NODE_CLIENT.message)
}

impl CsrController for Approver {
    const NAME: &'static str = "csr-approving-controller";

    async fn sync(&self, csr: &CertificateSigningRequest) -> Result<Synced, ApiError> {
        let status = &csr.status;
        if !status.certificate.is_empty()
            || status.condition(CONDITION_APPROVED).is_some()
            || status.condition(CONDITION_DENIED).is_some()
        {
            return Ok(Synced::Nothing);
        }
        let Some(message) = approval(&self.security.authorizer(), csr).await else {
            return Ok(Synced::Nothing);
        };
        let mut next = csr.clone();
        next.status
            .conditions
            .push(CertificateSigningRequestCondition {
                type_: CONDITION_APPROVED.into(),
                status: "True".into(),
                reason: "AutoApproved".into(),
                message: message.into(),
                ..Default::default()
            });
        let path = subresource_path(&csr.metadata.name, SUBRESOURCE_APPROVAL);
        match self
            .client
            .update(&path, &next)
            .await?
            .into_result::<serde_json::Value>()
        {
            Ok(_) => {
                tracing::info!(request = %csr.metadata.name, requester = %csr.spec.username,
                    "certificate signing request approved");
                Ok(Synced::Wrote)
            }
            Err(e) if lost_race(&e) => Ok(Synced::Wrote),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    fn agent_request(
        cn: &str,
        org: &str,
        signer: &str,
        usages: &[&str],
    ) -> CertificateSigningRequest {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "r"},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(pem),
                "signerName": signer,
                "usages": usages,
            },
        }))
        .unwrap()
    }

    /// (requester, its groups, (CN, O, signer, usages) asked for, approval message).
    type Case<'a> = (&'a str, &'a [&'a str], Asked<'a>, Option<&'a str>);
    type Asked<'a> = (&'a str, &'a str, &'a str, &'a [&'a str]);

    #[tokio::test]
    async fn only_nodes_and_bootstrappers_get_agent_certificates_approved() {
        const USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];
        let agent = SIGNER_APISERVER_CLIENT_AGENT;
        let cases: &[Case<'_>] = &[
            // The node itself.
            (
                "system:node:n1",
                &["system:nodes"],
                ("system:node:n1", "system:nodes", agent, USAGES),
                Some(SELF_NODE_CLIENT.message),
            ),
            // A bootstrap user, for any node.
            (
                "system:bootstrap:abc",
                &["system:bootstrappers"],
                ("system:node:n1", "system:nodes", agent, USAGES),
                Some(NODE_CLIENT.message),
            ),
            // An administrator: the authorizer allows it.
            (
                "admin",
                &["system:masters"],
                ("system:node:n1", "system:nodes", agent, USAGES),
                Some(NODE_CLIENT.message),
            ),
            // Another node, another user: no.
            (
                "system:node:n2",
                &["system:nodes"],
                ("system:node:n1", "system:nodes", agent, USAGES),
                None,
            ),
            (
                "jane",
                &["dev"],
                ("system:node:n1", "system:nodes", agent, USAGES),
                None,
            ),
            // Not an agent's client certificate: never approved automatically.
            (
                "system:node:n1",
                &["system:nodes"],
                ("system:node:n1", "dev", agent, USAGES),
                None,
            ),
            (
                "system:node:n1",
                &["system:nodes"],
                ("system:node:n1", "system:nodes", agent, &["client auth"]),
                None,
            ),
            (
                "system:node:n1",
                &["system:nodes"],
                (
                    "system:node:n1",
                    "system:nodes",
                    "svc.io/apiserver-client",
                    USAGES,
                ),
                None,
            ),
            (
                "system:node:n1",
                &["system:nodes"],
                (
                    "system:node:n1",
                    "system:nodes",
                    "svc.io/agent-serving",
                    USAGES,
                ),
                None,
            ),
        ];
        for (user, groups, (cn, org, signer, usages), want) in cases {
            let mut csr = agent_request(cn, org, signer, usages);
            csr.spec.username = user.to_string();
            csr.spec.groups = groups.iter().map(|g| g.to_string()).collect();
            assert_eq!(
                approval(&Chain::default(), &csr).await,
                *want,
                "{user} {groups:?} asking {cn}/{org} from {signer}"
            );
        }
    }
}
