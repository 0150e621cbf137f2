//! The state of a running server: what the handlers serve with (`Api`), and what only the
//! serving side needs: the in-flight limits and the egress dialers.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Context as _;
use prometheus_client::metrics::gauge::Gauge;
use svc_core::validation::declarative::{Mismatch, Mode, Validator};
use svc_storage::Store;
use tokio::sync::{Notify, watch};

use crate::base::features::Feature;
use crate::base::flags::Options;
use crate::base::lifecycle::{Farewells, PostStartHooks};
use crate::base::reload::ReloadMetrics;
use crate::http::api::Api;
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
    /// Everything the handlers serve with.
    pub api: Arc<Api>,
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
    /// Proxy mode (`--upstream-kubeconfig`): every request but the health probes goes to the
    /// upstream, and the registry is never reached. `None` in standalone mode.
    pub proxy: Option<Arc<Proxy>>,
    /// What h2 connections' watches hold outside the watch caches' rings
    /// (`svc_http2_watch_held_bytes`; bounded per connection by `h2ledger::WATCH_BUDGET`).
    pub h2_watch_held: Gauge,
    /// Writes h2 connections passed to their transport (`svc_http2_writes_total`).
    pub h2_writes: StripedCounter,
    /// `--list-niceness`: the threads lists run on (`bulk.rs`); `None` at 0.
    pub bulk: Option<Bulk>,
    /// The h2 connections yet to send their GOAWAY once shutdown asks them to close.
    pub farewells: Arc<Farewells>,
}

/// What a server is made of besides its options and store.
pub struct Parts {
    pub stop_watches: watch::Receiver<bool>,
    pub tokens: Tokens,
    /// `--tracing-config-file`, read.
    pub tracing: Option<trace::TracingConfiguration>,
    /// The admission plugins of the flags; the webhooks are added here.
    pub admission: admission::Chain,
    /// `--egress-selector-config-file`, read.
    pub egress: Egress,
    /// Metrics of the mode's own parts (a proxy's caches and upstream bounds), read at each
    /// scrape through the one registry.
    pub collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
}

impl ServerState {
    /// Every storage call goes through `store` wrapped in its timing metrics (and spans, with
    /// `tracing`). Needs a Tokio runtime when `tracing` is set.
    pub fn new(opts: Options, store: Arc<dyn Store>, parts: Parts) -> anyhow::Result<Self> {
        let Parts {
            stop_watches,
            tokens,
            tracing,
            admission,
            egress,
            collectors,
        } = parts;
        let caches = Caches::new(&opts.watch_cache_config());
        let mut metrics = Metrics::new();
        // A proxy never starts these caches (it has no store): its metrics list only the
        // caches it runs, those of `registry/caches/upstream.rs`.
        if opts.upstream_kubeconfig.is_none() {
            metrics.register_collector(caches.collector());
        }
        for c in collectors {
            metrics.register_collector(c);
        }
        let jwt = jwt::Runtime::register(metrics.registry_mut());
        let authentication_reloads = ReloadMetrics::register(
            metrics.registry_mut(),
            "apiserver_authentication_config_controller",
        );
        let authorization_reloads = ReloadMetrics::register(
            metrics.registry_mut(),
            "apiserver_authorization_config_controller",
        );
        let tracer = tracing
            .as_ref()
            .map(|config| tracer(config, &mut metrics))
            .transpose()?;
        let store = InstrumentedStore::wrap(store, metrics.store.clone(), tracer.clone());
        let validator = validator(&opts, &metrics);
        let webhook_metrics = WebhookMetrics::register(&mut metrics);
        let webhooks = Webhooks::new(&caches, egress.clone(), webhook_metrics);
        let admission = admission.with_webhooks(Arc::new(webhooks));
        let audit = auditor(&opts, &metrics, &egress)?;
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
        let bulk = match opts.list_niceness {
            0 => None,
            steps => {
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                Some(Bulk::new(threads, steps).context("starting the list threads")?)
            }
        };
        let registry = Registry {
            store,
            caches,
            validator,
            admission,
            namespace_changed: Notify::new(),
            stop_watches,
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
        let api = Api {
            opts,
            registry,
            security,
            metrics,
            tracer,
            hooks: PostStartHooks::default(),
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        };
        Ok(ServerState {
            api: Arc::new(api),
            readonly_inflight,
            mutating_inflight,
            watches,
            flow_metrics,
            egress,
            proxy: None,
            h2_watch_held,
            h2_writes,
            bulk,
            farewells: Arc::default(),
        })
    }
}

/// The tracer of `--tracing-config-file`, its dropped spans counted in `metrics`.
fn tracer(config: &trace::TracingConfiguration, metrics: &mut Metrics) -> anyhow::Result<Tracer> {
    let dropped = trace::DroppedSpans::default();
    metrics.register(
        "apiserver_tracing_dropped_spans",
        "Spans that never reached the collector: queue_full (the export queue was full) or \
         export_failed",
        dropped.clone(),
    );
    Tracer::start(config, dropped).context("starting traces")
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
