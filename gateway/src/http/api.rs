//! What the HTTP handlers serve with. Both modes: the options, metrics and traces, and the
//! server's lifecycle as health reports it (`Api`). Standalone mode adds the registry (store,
//! caches, validation, admission) and security (tokens, authorizers, authentication)
//! (`Standalone`); proxy mode adds the upstream (`http/proxy.rs`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tokio::sync::watch;

use crate::base::flags::Options;
use crate::base::lifecycle::PostStartHooks;
use crate::observe::metrics::Metrics;
use crate::observe::trace::Tracer;
use crate::registry::state::Registry;
use crate::security::state::Security;

/// What every request of either mode is served with.
pub struct Api {
    pub opts: Options,
    pub metrics: Metrics,
    /// Spans of requests (`--tracing-config-file`); `None`, the default, costs one branch
    /// per request.
    pub tracer: Option<Tracer>,
    pub hooks: PostStartHooks,
    pub started: Instant,
    /// Set when SIGTERM (or a test) starts shutdown: `/readyz` fails from then on.
    pub shutting_down: AtomicBool,
    /// Set when shutdown closes the listeners, after its delay: a watch asked for from then on
    /// would end within moments, so it is answered with a 429 instead.
    pub closing: AtomicBool,
    /// Flips to true when long-running requests (watches) must end.
    pub stop_watches: watch::Receiver<bool>,
}

/// Standalone mode: what its resource handlers, controllers and authentication serve with
/// besides the [`Api`]: the registry and security. A proxy has neither.
pub struct Standalone {
    pub api: Arc<Api>,
    pub registry: Arc<Registry>,
    pub security: Arc<Security>,
}
