//! What every typed operation reads and writes through: the store (wrapped in its metrics),
//! the watch caches, object validation, the admission chain, and the signal the namespace
//! controller listens to.

use std::sync::Arc;
use std::time::Duration;

use svc_core::validation::declarative::Validator;
use svc_storage::Store;
use tokio::sync::Notify;

use crate::registry::admission;
use crate::registry::caches::Caches;

pub struct Registry {
    /// Every storage call goes through this (timed, and traced with `tracing`).
    pub store: Arc<dyn Store>,
    /// One watch cache per served type: every list and watch is served from these.
    pub caches: Caches,
    /// Object validation on create and update: hand-written, and declarative per the
    /// `DeclarativeValidation` gates.
    pub validator: Validator,
    /// The admission plugins every write goes through (empty unless flags enable some).
    pub admission: admission::Chain,
    /// Nudges the namespace controller when a namespace starts terminating.
    pub namespace_changed: Notify,
    /// `--event-ttl`: how long a write keeps an object of a kind that expires.
    pub event_ttl: Duration,
    /// How long a list's continue token stays good (410 after).
    pub continue_token_ttl: Duration,
    /// `ListFromCacheSnapshot`: lists at a past revision read the caches' snapshots first.
    pub lists_from_snapshots: bool,
}
