//! `--authorization-config`: reads the AuthorizationConfiguration, builds its authorizers in
//! order (webhooks with their client and compiled match conditions, `AlwaysAllow`,
//! `AlwaysDeny`), each counted in `apiserver_authorization_decisions_total`, and installs
//! them after `system:masters` and the built-in policy. The file is re-read when it changes
//! (`reload.rs`); a version that does not load or build leaves the one in force, and every
//! attempt is logged and counted in
//! `apiserver_authorization_config_controller_automatic_reloads_total`.

use std::path::Path;
use std::sync::Arc;

use svc_config::authorization::{
    self as cfg, AuthorizationConfiguration, FAILURE_POLICY_DENY, WebhookConfiguration,
    compile_match_condition,
};
use svc_core::user::UserInfo;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::base::flags::Options;
use crate::base::reload;
use crate::observe::metrics::authz::AuthzMetrics;
use crate::outbound::client::WebhookClient;
use crate::outbound::egress::Egress;
use crate::security::authz::webhook::{FailurePolicy, Settings, Transport, WebhookAuthorizer};
use crate::security::authz::{
    AlwaysAllow, AlwaysDeny, Attributes, Authorizer, Decision, DecisionFuture,
};
use crate::security::state::Security;

/// Makes the transport of a webhook from its `connectionInfo`.
pub type Connect =
    dyn Fn(&WebhookConfiguration) -> Result<Arc<dyn Transport>, String> + Send + Sync;

/// The real transports: an HTTPS client from each webhook's `svcConfigFile`, dialling
/// through the `controlplane` egress selection.
pub fn connect_with(egress: Egress) -> Box<Connect> {
    Box::new(move |w: &WebhookConfiguration| {
        let path = w
            .connection_info
            .svc_config_file
            .as_deref()
            .unwrap_or_default();
        let client = WebhookClient::from_kubeconfig_file(Path::new(path), &egress)
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(client) as Arc<dyn Transport>)
    })
}

/// A webhook's match conditions, compiled (validation compiled them already; this keeps the
/// programs).
fn compile_conditions(w: &WebhookConfiguration) -> Result<Vec<svc_cel::Program>, String> {
    w.match_conditions
        .iter()
        .map(|c| compile_match_condition(&c.expression).map_err(|e| e.to_string()))
        .collect()
}

/// The configured authorizers of `config`, in order.
pub fn build(
    config: &AuthorizationConfiguration,
    metrics: &AuthzMetrics,
    connect: &Connect,
) -> Result<Vec<Box<dyn Authorizer>>, String> {
    let mut out: Vec<Box<dyn Authorizer>> = Vec::with_capacity(config.authorizers.len());
    for a in &config.authorizers {
        let inner: Box<dyn Authorizer> = match (a.type_.as_str(), &a.webhook) {
            (cfg::TYPE_ALWAYS_ALLOW, _) => Box::new(AlwaysAllow {
                name: a.name.clone(),
            }),
            (cfg::TYPE_ALWAYS_DENY, _) => Box::new(AlwaysDeny {
                name: a.name.clone(),
            }),
            (cfg::TYPE_WEBHOOK, Some(w)) => {
                let transport = connect(w).map_err(|e| format!("authorizer {:?}: {e}", a.name))?;
                let conditions =
                    compile_conditions(w).map_err(|e| format!("authorizer {:?}: {e}", a.name))?;
                Box::new(WebhookAuthorizer::new(
                    settings(&a.name, w),
                    conditions,
                    transport,
                    metrics.clone(),
                ))
            }
            (other, _) => {
                return Err(format!(
                    "authorizer {:?}: type {other:?} is not supported by this server",
                    a.name
                ));
            }
        };
        out.push(Box::new(Instrumented {
            inner,
            type_: a.type_.clone(),
            metrics: metrics.clone(),
        }));
    }
    Ok(out)
}

fn settings(name: &str, w: &WebhookConfiguration) -> Settings {
    Settings {
        name: name.to_string(),
        authorized_ttl: w.authorized_ttl.to_std(),
        unauthorized_ttl: w.unauthorized_ttl.to_std(),
        timeout: w.timeout.to_std(),
        review_version: w.subject_access_review_version.clone(),
        failure_policy: if w.failure_policy == FAILURE_POLICY_DENY {
            FailurePolicy::Deny
        } else {
            FailurePolicy::NoOpinion
        },
    }
}

/// A configured authorizer whose terminal decisions are counted.
struct Instrumented {
    inner: Box<dyn Authorizer>,
    type_: String,
    metrics: AuthzMetrics,
}

impl Authorizer for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a Attributes<'a>,
    ) -> DecisionFuture<'a> {
        Box::pin(async move {
            let d = self.inner.authorize(user, attrs).await;
            match &d {
                Decision::Allow => self.metrics.decision(&self.type_, self.name(), true),
                Decision::Deny(_) => self.metrics.decision(&self.type_, self.name(), false),
                Decision::NoOpinion(_) => {}
            }
            d
        })
    }
}

/// Loads `--authorization-config` when given (an error stops the start) and re-reads it
/// through `reload.rs` every `--config-reload-interval` until shutdown: a changed file that
/// loads and builds replaces the configured authorizers, anything else leaves them alone.
pub fn start(
    security: &Arc<Security>,
    opts: &Options,
    metrics: &AuthzMetrics,
    stop: watch::Receiver<bool>,
    connect: Box<Connect>,
) -> Result<Option<JoinHandle<()>>, String> {
    let Some(path) = opts.authorization_config.clone() else {
        return Ok(None);
    };
    let bytes = reload::read_file(&path)?;
    let config = load(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    security.set_authorizers(build(&config, metrics, &*connect)?);
    tracing::info!(path = %path.display(), authorizers = config.authorizers.len(),
        "authorization configuration loaded");
    let target = security.clone();
    let metrics = metrics.clone();
    let apply = move |bytes: &[u8]| {
        let config = load(bytes)?;
        target.set_authorizers(build(&config, &metrics, &*connect)?);
        Ok(())
    };
    Ok(Some(reload::spawn(
        "authorization",
        path,
        opts.config_reload_interval,
        security.authorization_reloads.clone(),
        stop,
        apply,
    )))
}

fn load(bytes: &[u8]) -> Result<AuthorizationConfiguration, String> {
    svc_config::load::<AuthorizationConfiguration>(bytes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::authz::ResourceAccess;

    fn no_transport(_: &WebhookConfiguration) -> Result<Arc<dyn Transport>, String> {
        Err("no transport in this test".into())
    }

    #[tokio::test]
    async fn built_ins_are_built_in_order_and_counted() {
        let config = svc_config::load::<AuthorizationConfiguration>(
            b"apiVersion: apiserver.svc.io/v1\nkind: AuthorizationConfiguration\nauthorizers:\n\
              - {type: AlwaysDeny, name: first}\n- {type: AlwaysAllow, name: second}\n",
        )
        .unwrap();
        let metrics = crate::observe::metrics::Metrics::new();
        let built = build(&config, &metrics.authz, &no_transport).unwrap();
        let names: Vec<&str> = built.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["first", "second"]);
        let user = UserInfo::default();
        let attrs = Attributes {
            verb: "list",
            resource: Some(ResourceAccess {
                group: "",
                version: "v1",
                resource: "namespaces",
                subresource: None,
                namespace: "",
                name: None,
            }),
            path: "",
        };
        assert_eq!(
            built[0].authorize(&user, &attrs).await,
            Decision::NoOpinion(crate::security::authz::ALWAYS_DENY_REASON.into())
        );
        assert_eq!(built[1].authorize(&user, &attrs).await, Decision::Allow);
        let chain = crate::security::authz::Chain::new(built);
        assert!(chain.authorize(&user, &attrs).await.is_ok());
        let scrape = metrics.encode();
        assert!(
            scrape.contains(
                "apiserver_authorization_decisions_total{type=\"AlwaysAllow\",name=\"second\",decision=\"allowed\"} 2"
            ),
            "{scrape}"
        );
        assert!(!scrape.contains("name=\"first\",decision"), "{scrape}");
    }

    #[test]
    fn a_webhook_that_cannot_connect_fails_the_build() {
        let config = svc_config::load::<AuthorizationConfiguration>(
            br#"{"apiVersion":"apiserver.svc.io/v1beta1","kind":"AuthorizationConfiguration",
            "authorizers":[{"type":"Webhook","name":"w","webhook":{"timeout":"1s",
            "subjectAccessReviewVersion":"v1","matchConditionSubjectAccessReviewVersion":"v1",
            "failurePolicy":"Deny","connectionInfo":{"type":"SvcConfig","svcConfigFile":"/x"}}}]}"#,
        )
        .unwrap();
        let metrics = crate::observe::metrics::Metrics::new();
        let err = build(&config, &metrics.authz, &no_transport).err().unwrap();
        assert_eq!(err, "authorizer \"w\": no transport in this test");
    }
}
