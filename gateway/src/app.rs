//! The shared state of a running server: options, store, metrics, health and shutdown signals.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use svc_storage::Store;
use tokio::sync::{Notify, watch};

use crate::caches::Caches;
use crate::config::Options;
use crate::lifecycle::PostStartHooks;
use crate::metrics::Metrics;
use crate::metrics::store::InstrumentedStore;

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
}

impl App {
    /// Every storage call goes through `store` wrapped in its timing metrics.
    pub fn new(opts: Options, store: Arc<dyn Store>, stop_watches: watch::Receiver<bool>) -> Self {
        let caches = Caches::new(&opts.watch_cache_config());
        let mut metrics = Metrics::new();
        metrics.register_collector(caches.collector());
        let store = InstrumentedStore::wrap(store, metrics.store.clone());
        App {
            opts,
            store,
            metrics,
            hooks: PostStartHooks::default(),
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            stop_watches,
            namespace_changed: Notify::new(),
            caches,
        }
    }
}
