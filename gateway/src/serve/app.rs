//! The shared state of a running server: options, store, metrics, traces, validation, health
//! and shutdown signals.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use svc_core::validation::declarative::{Mismatch, Mode, Validator};
use svc_storage::Store;
use tokio::sync::{Notify, watch};

use crate::base::features::Feature;
use crate::base::flags::Options;
use crate::base::lifecycle::PostStartHooks;
use crate::base::reload::ReloadMetrics;
use crate::http::limits::{FairConfig, FairLimit, FlowMetrics, InflightLimit};
use crate::observe::metrics::Metrics;
use crate::observe::metrics::store::InstrumentedStore;
use crate::observe::trace::{self, Tracer};
use crate::outbound::egress::Egress;
use crate::registry::admission;
use crate::registry::caches::Caches;
use crate::security::jwt;
use crate::security::tokens::Tokens;
use crate::{security::audit, security::authz};

pub struct App {
    pub opts: Options,
    pub store: Arc<dyn Store>,
    pub metrics: Metrics,
    pub hooks: PostStartHooks,
    pub started: Instant,
    /// Set when SIGTERM (or a test) starts shutdown: `/readyz` fails from then on.
    pub shutting_down: AtomicBool,
    /// Flips to true when long-running requests (watches) must end.
    pub stop_watches: watch::Receiver<bool>,
    /// Nudges the namespace controller when a namespace starts terminating.
    pub namespace_changed: Notify,
    /// One watch cache per served type: every list and watch is served from these.
    pub caches: Caches,
    /// Object validation on create and update: hand-written, and declarative per the
    /// `DeclarativeValidation` gates.
    pub validator: Validator,
    /// Issues and verifies service-account tokens.
    pub tokens: Tokens,
    /// `--max-requests-inflight` and `--max-mutating-requests-inflight`.
    /// Each a pool of seats with fair queuing by user (`limits.rs`).
    pub readonly_inflight: FairLimit,
    pub mutating_inflight: FairLimit,
    /// `--max-watches`.
    pub watches: InflightLimit,
    /// Rejections the pipeline counts itself (watches past `--max-watches`).
    pub flow_metrics: FlowMetrics,
    /// The admission plugins every write goes through (empty unless flags enable some).
    pub admission: admission::Chain,
    /// Spans of requests (`--tracing-config-file`); `None`, the default, costs one branch
    /// per request.
    pub tracer: Option<Tracer>,
    /// How webhook clients (`controlplane`) dial out: `--egress-selector-config-file`.
    pub egress: Egress,
    /// Who may do what: `system:masters`, the built-in policy, then configured authorizers;
    /// replaced whole when the configuration changes.
    authorizer: parking_lot::RwLock<Arc<authz::Chain>>,
    /// Audit policy and backends; None when `--audit-policy-file` is unset, and then the
    /// pipeline skips auditing on this one check.
    pub audit: Option<Arc<audit::Auditor>>,
    /// `--authentication-config` as loaded (JWT authenticators, anonymous access); replaced
    /// whole when the file changes.
    authentication: parking_lot::RwLock<Arc<jwt::Authentication>>,
    /// The JWT authenticators' metrics and the issuers' key sources, kept across reloads.
    pub jwt: jwt::Shared,
    /// `apiserver_authentication_config_controller_automatic_reload*`.
    pub authentication_reloads: ReloadMetrics,
    /// `apiserver_authorization_config_controller_automatic_reload*`.
    pub authorization_reloads: ReloadMetrics,
}

impl App {
    /// Every storage call goes through `store` wrapped in its timing metrics (and spans, with
    /// `tracing`). Needs a Tokio runtime when `tracing` is set.
    pub fn new(
        opts: Options,
        store: Arc<dyn Store>,
        stop_watches: watch::Receiver<bool>,
        tokens: Tokens,
        tracing: Option<&trace::TracingConfiguration>,
    ) -> Result<Self, trace::TraceError> {
        let caches = Caches::new(&opts.watch_cache_config());
        let mut metrics = Metrics::new();
        metrics.register_collector(caches.collector());
        let jwt = jwt::Shared::register(metrics.registry_mut());
        let authentication_reloads = ReloadMetrics::register(
            metrics.registry_mut(),
            "apiserver_authentication_config_controller",
        );
        let authorization_reloads = ReloadMetrics::register(
            metrics.registry_mut(),
            "apiserver_authorization_config_controller",
        );
        let tracer = match tracing {
            None => None,
            Some(config) => {
                let dropped = trace::DroppedSpans::default();
                metrics.register(
                    "apiserver_tracing_dropped_spans",
                    "Spans that never reached the collector: queue_full (the export queue was \
                     full) or export_failed",
                    dropped.clone(),
                );
                Some(Tracer::start(config, dropped)?)
            }
        };
        let store = InstrumentedStore::wrap(store, metrics.store.clone(), tracer.clone());
        let validator = validator(&opts, &metrics);
        let flow_metrics = FlowMetrics::default();
        for (name, help, family) in flow_metrics.families() {
            metrics.register(name, help, family);
        }
        let pool = |seats| FairConfig {
            seats,
            queue_length: opts.max_queued_requests_per_user,
            max_queues: opts.max_queued_users,
            max_wait: opts.max_queue_wait,
        };
        let readonly_inflight = FairLimit::new(
            "readOnly",
            pool(opts.max_requests_inflight),
            flow_metrics.clone(),
        );
        let mutating_inflight = FairLimit::new(
            "mutating",
            pool(opts.max_mutating_requests_inflight),
            flow_metrics.clone(),
        );
        let watches = InflightLimit::new(opts.max_watches);
        Ok(App {
            opts,
            store,
            metrics,
            hooks: PostStartHooks::default(),
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            stop_watches,
            namespace_changed: Notify::new(),
            caches,
            validator,
            tokens,
            authorizer: parking_lot::RwLock::new(Arc::new(authz::Chain::default())),
            admission: admission::Chain::default(),
            readonly_inflight,
            mutating_inflight,
            watches,
            flow_metrics,
            tracer,
            audit: None,
            authentication: Default::default(),
            jwt,
            authentication_reloads,
            authorization_reloads,
            egress: Egress::direct(),
        })
    }
}

impl App {
    /// The authorizer chain in force.
    pub fn authorizer(&self) -> Arc<authz::Chain> {
        self.authorizer.read().clone()
    }

    /// Replaces the configured authorizers (those after `system:masters` and the built-in
    /// policy); requests already being authorized finish with the chain they started with.
    pub fn set_authorizers(&self, configured: Vec<Box<dyn authz::Authorizer>>) {
        *self.authorizer.write() = Arc::new(authz::Chain::new(configured));
    }
}

impl App {
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

/// The validator the gates ask for; mismatches are logged and counted in
/// `declarative_validation_mismatch_total`.
fn validator(opts: &Options, metrics: &Metrics) -> Validator {
    let gates = &opts.feature_gates;
    let mode = match (
        gates.enabled(Feature::DeclarativeValidation),
        gates.enabled(Feature::DeclarativeValidationTakeover),
    ) {
        (false, takeover) => {
            if takeover {
                tracing::warn!(
                    "DeclarativeValidationTakeover has no effect without DeclarativeValidation: \
                     hand-written validation only"
                );
            }
            Mode::HandwrittenOnly
        }
        (true, false) => Mode::Compare,
        (true, true) => Mode::Takeover,
    };
    let mismatches = metrics.validation_mismatches();
    let mut validator = Validator::new(mode, move |m: &Mismatch| {
        mismatches.inc();
        tracing::warn!(mismatch = %m, "declarative validation disagrees with hand-written validation");
    });
    for (kind, rule) in &opts.extra_declarative_rules {
        validator = validator.with_rule(kind, *rule);
    }
    validator
}
