//! The state of a running server: what the handlers of both modes serve with (`Api`), the
//! mode (standalone over its store, or a proxy of an upstream), and what only the serving side
//! needs: the in-flight limits and the egress dialers.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Context as _;
use prometheus_client::metrics::gauge::Gauge;
use svc_core::validation::declarative::{self, Mismatch, Validator};
use svc_storage::Store;
use tokio::sync::{Notify, watch};

use crate::base::features::Feature;
use crate::base::flags::Options;
use crate::base::lifecycle::{Farewells, PostStartHooks};
use crate::base::reload::ReloadMetrics;
use crate::http::api::{Api, Standalone};
use crate::http::limits::{FairConfig, FairLimit, FlowMetrics, InflightLimit};
use crate::http::proxy::Proxy;
use crate::observe::metrics::Metrics;
use crate::observe::metrics::store::InstrumentedStore;
use crate::observe::metrics::striped::StripedCounter;
use crate::observe::trace::{self, Tracer};
use crate::outbound::client::WebhookClient;
use crate::outbound::egress::Egress;
use crate::registry::admission::{self, webhook::Webhooks, webhook::call::WebhookMetrics};
use crate::registry::caches::Caches;
use crate::registry::state::Registry;
use crate::security::state::Security;
use crate::security::tokens::Tokens;
use crate::security::{audit, jwt};
use crate::serve::bulk::Bulk;

pub struct ServerState {
    /// What the handlers of both modes serve with.
    pub api: Arc<Api>,
    /// What the server serves from.
    pub mode: Mode,
    /// `--max-requests-inflight` and `--max-mutating-requests-inflight`.
    /// Each a pool of seats with fair queuing by user (`limits.rs`).
    pub readonly_inflight: FairLimit,
    pub mutating_inflight: FairLimit,
    /// `--max-watches`.
    pub watches: InflightLimit,
    /// Rejections the pipeline counts itself (watches past `--max-watches`).
    pub flow_metrics: FlowMetrics,
    /// How webhook clients (`controlplane`) dial out: `--egress-selector-config-file`.
    pub egress: Egress,
    /// What h2 connections' watches hold outside the watch caches' rings
    /// (`svc_http2_watch_held_bytes`; bounded per connection by `h2ledger::WATCH_BUDGET`).
    pub h2_watch_held: Gauge,
    /// Writes h2 connections passed to their transport (`svc_http2_writes_total`).
    pub h2_writes: StripedCounter,
    /// Those the transport took only part of (`svc_http2_short_writes_total`).
    pub h2_short_writes: StripedCounter,
    /// `--list-niceness`: the threads lists run on (`bulk.rs`); `None` at 0.
    pub bulk: Option<Bulk>,
    /// The h2 connections yet to send their GOAWAY once shutdown asks them to close.
    pub farewells: Arc<Farewells>,
}

/// The two modes, and what each has that the other does not.
pub enum Mode {
    /// Standalone: the registry over its own store, and security (authentication,
    /// authorization, audit). Every request goes through `pipeline.rs`.
    Store(Arc<Standalone>),
    /// Proxy mode (`--upstream-kubeconfig`): the upstream, its caches and bounds. Every
    /// request goes through `proxied.rs`; there is no registry, store, admission or
    /// authorizer (the upstream authorizes).
    Upstream(Arc<Proxy>),
}

impl ServerState {
    /// Standalone mode's parts, or `None` in proxy mode.
    pub fn standalone(&self) -> Option<&Arc<Standalone>> {
        match &self.mode {
            Mode::Store(own) => Some(own),
            Mode::Upstream(_) => None,
        }
    }
}

/// What a server of either mode is made of besides its options.
pub struct Parts {
    pub stop_watches: watch::Receiver<bool>,
    /// `--tracing-config-file`, read.
    pub tracing: Option<trace::TracingConfiguration>,
    /// `--egress-selector-config-file`, read.
    pub egress: Egress,
    /// Metrics of the mode's own parts (a proxy's caches and upstream bounds), read at each
    /// scrape through the one registry.
    pub collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
}

/// What standalone mode is made of besides the [`Parts`].
pub struct StoreParts {
    pub store: Arc<dyn Store>,
    pub tokens: Tokens,
    /// The admission plugins of the flags; the webhooks are added here.
    pub admission: admission::Chain,
}

impl ServerState {
    /// Standalone mode. Every storage call goes through `store` wrapped in its timing metrics
    /// (and spans, with `tracing`). Needs a Tokio runtime when `tracing` is set.
    pub fn over_store(
        opts: Options,
        parts: Parts,
        own: StoreParts,
    ) -> anyhow::Result<(Self, Arc<Standalone>)> {
        let StoreParts {
            store,
            tokens,
            admission,
        } = own;
        let mut metrics = Metrics::new();
        let tracer = tracer(&parts, &mut metrics)?;
        let caches = Caches::new(&opts.watch_cache_config());
        metrics.register_collector(caches.collector());
        let jwt = jwt::Runtime::register(metrics.registry_mut());
        let authentication_reloads = ReloadMetrics::register(
            metrics.registry_mut(),
            "apiserver_authentication_config_controller",
        );
        let authorization_reloads = ReloadMetrics::register(
            metrics.registry_mut(),
            "apiserver_authorization_config_controller",
        );
        let store = InstrumentedStore::wrap(store, metrics.store.clone(), tracer.clone());
        let validator = validator(&opts, &metrics);
        let webhook_metrics = WebhookMetrics::register(&mut metrics);
        let webhooks = Webhooks::new(&caches, parts.egress.clone(), webhook_metrics);
        let admission = admission.with_webhooks(Arc::new(webhooks));
        let audit = auditor(&opts, &metrics, &parts.egress)?;
        let registry = Registry {
            store,
            caches,
            validator,
            admission,
            namespace_changed: Notify::new(),
            event_ttl: opts.event_ttl,
            continue_token_ttl: opts.continue_token_ttl,
            lists_from_snapshots: opts.feature_gates.enabled(Feature::ListFromCacheSnapshot),
        };
        let security = Arc::new(Security::new(
            tokens,
            jwt,
            audit,
            authentication_reloads,
            authorization_reloads,
        ));
        Self::assemble(opts, parts, metrics, tracer, |api| {
            let own = Arc::new(Standalone {
                api: api.clone(),
                registry: Arc::new(registry),
                security,
            });
            (Mode::Store(own.clone()), own)
        })
    }

    /// Proxy mode: `proxy` and the parts, and nothing of standalone mode's (its metrics
    /// list only what a proxy runs).
    pub fn over_upstream(opts: Options, parts: Parts, proxy: Proxy) -> anyhow::Result<Self> {
        let mut metrics = Metrics::for_proxy();
        let tracer = tracer(&parts, &mut metrics)?;
        let (state, ()) = Self::assemble(opts, parts, metrics, tracer, |_| {
            (Mode::Upstream(Arc::new(proxy)), ())
        })?;
        Ok(state)
    }

    /// What both modes build the same way: the in-flight limits, the h2 connections'
    /// metrics, the list threads and the [`Api`]; the mode is made with the `Api`, and
    /// whatever else `mode` makes with it is handed back beside the state.
    fn assemble<T>(
        opts: Options,
        parts: Parts,
        mut metrics: Metrics,
        tracer: Option<Tracer>,
        mode: impl FnOnce(&Arc<Api>) -> (Mode, T),
    ) -> anyhow::Result<(Self, T)> {
        let Parts {
            stop_watches,
            egress,
            collectors,
            tracing: _,
        } = parts;
        for c in collectors {
            metrics.register_collector(c);
        }
        let flow_metrics = FlowMetrics::default();
        for (name, help, family) in flow_metrics.families() {
            metrics.register(name, help, family);
        }
        let pool = |seats| FairConfig {
            seats,
            queue_length: opts.max_queued_requests_per_user,
            max_queues: opts.max_queued_users,
            max_queued: opts.max_queued_requests,
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
        let h2_watch_held = Gauge::default();
        metrics.register(
            "svc_http2_watch_held_bytes",
            "Bytes h2 connections' watches hold outside the watch caches: drained batches and \
             what h2 has not written yet",
            h2_watch_held.clone(),
        );
        let h2_writes = StripedCounter::default();
        metrics.register(
            "svc_http2_writes",
            "Writes h2 connections passed to their transport (TLS or TCP): each carries the \
             frames one round of the connection's task gathered, for every stream it served",
            h2_writes.clone(),
        );
        let h2_short_writes = StripedCounter::default();
        metrics.register(
            "svc_http2_short_writes",
            "Writes of h2 connections their transport took only part of (its buffer full: the \
             client reads slower than the connection writes); the rest goes in later writes",
            h2_short_writes.clone(),
        );
        let bulk = match opts.list_niceness {
            0 => None,
            steps => {
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                Some(Bulk::new(threads, steps).context("starting the list threads")?)
            }
        };
        let api = Arc::new(Api {
            opts,
            metrics,
            tracer,
            hooks: PostStartHooks::default(),
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            stop_watches,
        });
        let (mode, made) = mode(&api);
        let state = ServerState {
            mode,
            api,
            readonly_inflight,
            mutating_inflight,
            watches,
            flow_metrics,
            egress,
            h2_watch_held,
            h2_writes,
            h2_short_writes,
            bulk,
            farewells: Arc::default(),
        };
        Ok((state, made))
    }
}

/// The tracer of `--tracing-config-file` (none without one), its dropped spans counted in
/// `metrics`.
fn tracer(parts: &Parts, metrics: &mut Metrics) -> anyhow::Result<Option<Tracer>> {
    let Some(config) = &parts.tracing else {
        return Ok(None);
    };
    let dropped = trace::DroppedSpans::default();
    metrics.register(
        "apiserver_tracing_dropped_spans",
        "Spans that never reached the collector: queue_full (the export queue was full) or \
         export_failed",
        dropped.clone(),
    );
    Tracer::start(config, dropped)
        .map(Some)
        .context("starting traces")
}

/// The auditor of `--audit-policy-file` with its backends (None without a policy).
fn auditor(
    opts: &Options,
    metrics: &Metrics,
    egress: &Egress,
) -> anyhow::Result<Option<Arc<audit::Auditor>>> {
    let webhook = match &opts.audit.audit_webhook_config_file {
        None => None,
        Some(path) => Some(Arc::new(
            WebhookClient::from_kubeconfig_file(path, egress)
                .map_err(|e| anyhow::anyhow!("--audit-webhook-config-file: {e}"))?,
        ) as Arc<dyn audit::webhook::Destination>),
    };
    audit::Auditor::from_options(&opts.audit, &metrics.audit, webhook).map_err(anyhow::Error::msg)
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
            declarative::Mode::HandwrittenOnly
        }
        (true, false) => declarative::Mode::Compare,
        (true, true) => declarative::Mode::Takeover,
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
