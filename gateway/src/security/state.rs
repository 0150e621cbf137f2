//! The security state of a running server: the service-account token issuer and verifier,
//! the authorizer chain and the authentication configuration in force (each replaced whole
//! when its file changes), the JWT authenticators' shared parts, and the auditor.

use std::sync::Arc;

use crate::base::reload::ReloadMetrics;
use crate::security::tokens::Tokens;
use crate::security::{audit, authz, jwt};

pub struct Security {
    /// Issues and verifies service-account tokens.
    pub tokens: Tokens,
    /// Who may do what: `system:masters`, the built-in policy, then configured authorizers;
    /// replaced whole when the configuration changes.
    authorizer: parking_lot::RwLock<Arc<authz::Chain>>,
    /// `--authentication-config` as loaded (JWT authenticators, anonymous access); replaced
    /// whole when the file changes.
    authentication: parking_lot::RwLock<Arc<jwt::Authentication>>,
    /// The JWT authenticators' metrics and the issuers' key sources, kept across reloads.
    pub jwt: jwt::Runtime,
    /// Audit policy and backends; None when `--audit-policy-file` is unset, and then the
    /// pipeline skips auditing on this one check.
    pub audit: Option<Arc<audit::Auditor>>,
    /// `apiserver_authentication_config_controller_automatic_reload*`.
    pub authentication_reloads: ReloadMetrics,
    /// `apiserver_authorization_config_controller_automatic_reload*`.
    pub authorization_reloads: ReloadMetrics,
}

impl Security {
    pub fn new(
        tokens: Tokens,
        jwt: jwt::Runtime,
        audit: Option<Arc<audit::Auditor>>,
        authentication_reloads: ReloadMetrics,
        authorization_reloads: ReloadMetrics,
    ) -> Self {
        Security {
            tokens,
            authorizer: parking_lot::RwLock::new(Arc::new(authz::Chain::default())),
            authentication: Default::default(),
            jwt,
            audit,
            authentication_reloads,
            authorization_reloads,
        }
    }

    /// The authorizer chain in force.
    pub fn authorizer(&self) -> Arc<authz::Chain> {
        self.authorizer.read().clone()
    }

    /// Replaces the configured authorizers (those after `system:masters` and the built-in
    /// policy); requests already being authorized finish with the chain they started with.
    pub fn set_authorizers(&self, configured: Vec<Box<dyn authz::Authorizer>>) {
        *self.authorizer.write() = Arc::new(authz::Chain::new(configured));
    }

    /// The authentication configuration in force.
    pub fn authentication(&self) -> Arc<jwt::Authentication> {
        self.authentication.read().clone()
    }

    /// Puts a newly loaded authentication configuration in force; requests already being
    /// authenticated finish with the one they started with.
    pub fn set_authentication(&self, config: jwt::Authentication) {
        *self.authentication.write() = Arc::new(config);
    }
}
