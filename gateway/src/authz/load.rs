//! `--authorization-config`: reads the AuthorizationConfiguration, builds its authorizers in
//! order (webhooks with their client and compiled match conditions, `AlwaysAllow`,
//! `AlwaysDeny`), each counted in `apiserver_authorization_decisions_total`, and installs
//! them after `system:masters` and the built-in policy. The file is re-read when it changes;
//! a version that does not load or build leaves the one in force, and every attempt is
//! logged and counted in `apiserver_authorization_config_controller_automatic_reloads_total`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use svc_core::cel;
use svc_core::config::authorization::{
    self as cfg, AuthorizationConfiguration, FAILURE_POLICY_DENY, WebhookConfiguration,
    compile_match_condition,
};
use svc_core::user::UserInfo;

use super::webhook::{FailurePolicy, Settings, Transport, WebhookAuthorizer};
use super::{AlwaysAllow, AlwaysDeny, Attributes, Authorizer, Decision, DecisionFuture};
use crate::app::App;
use crate::client::WebhookClient;
use crate::egress::Egress;
use crate::metrics::authz::AuthzMetrics;

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
fn compile_conditions(w: &WebhookConfiguration) -> Result<Vec<cel::Program>, String> {
    w.match_conditions
        .iter()
        .map(|c| compile_match_condition(&c.expression).map_err(|e| e.to_string()))
        .collect()
}

/// Reads and validates the file at `path`; errors name the file and each field.
pub fn read(path: &Path) -> Result<(Vec<u8>, AuthorizationConfiguration), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let config = svc_core::config::load::<AuthorizationConfiguration>(&bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((bytes, config))
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

/// The configuration file in force and how to build from it.
pub struct ConfigFile {
    path: PathBuf,
    connect: Box<Connect>,
    /// The bytes of the version in force: an unchanged file is not rebuilt.
    current: Mutex<Vec<u8>>,
}

impl ConfigFile {
    /// Loads `path` and installs its authorizers; an error here stops the server from
    /// starting.
    pub fn install(app: &App, path: PathBuf, connect: Box<Connect>) -> Result<Self, String> {
        let (bytes, config) = read(&path)?;
        let authorizers = build(&config, &app.metrics.authz, &*connect)?;
        app.set_authorizers(authorizers);
        tracing::info!(path = %path.display(), authorizers = config.authorizers.len(),
            "authorization configuration loaded");
        Ok(ConfigFile {
            path,
            connect,
            current: Mutex::new(bytes),
        })
    }

    /// Re-reads the file: when its content changed and loads, its authorizers replace those
    /// in force. Returns None when nothing changed, else whether the new version was taken.
    pub fn reload(&self, app: &App) -> Option<bool> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) => {
                // A file being replaced may be briefly absent: keep what is in force.
                tracing::warn!(path = %self.path.display(), error = %e,
                    "authorization configuration unreadable; keeping the one in force");
                app.metrics.authz.reload(false);
                return Some(false);
            }
        };
        if *self.current.lock() == bytes {
            return None;
        }
        let built = svc_core::config::load::<AuthorizationConfiguration>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|c| build(&c, &app.metrics.authz, &*self.connect));
        *self.current.lock() = bytes;
        match built {
            Ok(authorizers) => {
                app.set_authorizers(authorizers);
                app.metrics.authz.reload(true);
                tracing::info!(path = %self.path.display(), "authorization configuration reloaded");
                Some(true)
            }
            Err(e) => {
                app.metrics.authz.reload(false);
                tracing::error!(path = %self.path.display(), error = %e,
                    "authorization configuration invalid; keeping the one in force");
                Some(false)
            }
        }
    }
}

/// Loads `--authorization-config` when given (an error stops the start) and re-reads it
/// every `--authorization-config-reload-interval` until shutdown.
pub fn start(app: &Arc<App>, connect: Box<Connect>) -> Result<(), String> {
    let Some(path) = app.opts.authorization_config.clone() else {
        return Ok(());
    };
    let file = ConfigFile::install(app, path, connect)?;
    let app = app.clone();
    let interval = app
        .opts
        .authorization_config_reload_interval
        .max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut stop = app.stop_watches.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {
                    file.reload(&app);
                }
                _ = crate::lifecycle::until_set(&mut stop) => return,
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::ResourceAttributes;

    fn no_transport(_: &WebhookConfiguration) -> Result<Arc<dyn Transport>, String> {
        Err("no transport in this test".into())
    }

    #[tokio::test]
    async fn built_ins_are_built_in_order_and_counted() {
        let config = svc_core::config::load::<AuthorizationConfiguration>(
            b"apiVersion: apiserver.svc.io/v1\nkind: AuthorizationConfiguration\nauthorizers:\n\
              - {type: AlwaysDeny, name: first}\n- {type: AlwaysAllow, name: second}\n",
        )
        .unwrap();
        let metrics = crate::metrics::Metrics::new();
        let built = build(&config, &metrics.authz, &no_transport).unwrap();
        let names: Vec<&str> = built.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["first", "second"]);
        let user = UserInfo::default();
        let attrs = Attributes {
            verb: "list",
            resource: Some(ResourceAttributes {
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
            Decision::NoOpinion(super::super::ALWAYS_DENY_REASON.into())
        );
        assert_eq!(built[1].authorize(&user, &attrs).await, Decision::Allow);
        let chain = super::super::Chain::new(built);
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
        let config = svc_core::config::load::<AuthorizationConfiguration>(
            br#"{"apiVersion":"apiserver.svc.io/v1beta1","kind":"AuthorizationConfiguration",
            "authorizers":[{"type":"Webhook","name":"w","webhook":{"timeout":"1s",
            "subjectAccessReviewVersion":"v1","matchConditionSubjectAccessReviewVersion":"v1",
            "failurePolicy":"Deny","connectionInfo":{"type":"SvcConfig","svcConfigFile":"/x"}}}]}"#,
        )
        .unwrap();
        let metrics = crate::metrics::Metrics::new();
        let err = build(&config, &metrics.authz, &no_transport).err().unwrap();
        assert_eq!(err, "authorizer \"w\": no transport in this test");
    }
}
