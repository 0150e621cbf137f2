//! What the HTTP handlers serve with: the options, the registry (store, caches, validation,
//! admission), security (tokens, authorizers, authentication), metrics and traces, and the
//! server's lifecycle as health reports it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::base::flags::Options;
use crate::base::lifecycle::PostStartHooks;
use crate::observe::metrics::Metrics;
use crate::observe::trace::Tracer;
use crate::registry::state::Registry;
use crate::security::state::Security;

pub struct Api {
    pub opts: Options,
    pub registry: Registry,
    pub security: Arc<Security>,
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
}
