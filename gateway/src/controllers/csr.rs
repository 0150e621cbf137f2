//! The built-in CertificateSigningRequest controllers, which Kubernetes runs in its
//! controller manager and every gateway runs here: `approver` approves node agents'
//! requests for their own client certificates, `signer` issues the certificates of the
//! built-in signers.
//!
//! Both read the gateway's own watch cache and write through the loopback client (the same
//! pipeline as any client) with the `resourceVersion` they read. With several gateways on
//! one etcd each of them sees every request, and the first write wins: the others get 409
//! Conflict and, once their caches catch up, find nothing left to do. So each request is
//! approved and issued once.

mod approver;
mod signer;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use svc_core::kinds::CertificateSigningRequest;
use svc_core::watch::{FrameFormat, Selector, WatchCache, WatchRequest, WatchStart};
use svc_core::{ApiError, Resource};
use svc_storage::Revision;

use crate::base::lifecycle::until_set;
use crate::outbound::pki::Pki;
use crate::registry::state::Registry;
use crate::security::state::Security;
use crate::serve::app::ServerState;

/// How often every request is looked at even when none changed.
const RESYNC: Duration = Duration::from_secs(30);
/// How soon a pass that failed for a passing reason (the store unavailable) is retried.
const RETRY: Duration = Duration::from_secs(1);
/// Frames a drain may return at once; the controllers only need to know that something
/// changed, then they read the cache.
const DRAIN_BYTES: usize = 1 << 20;

/// Starts the CSR approving and signing controllers.
pub fn start(
    app: &Arc<ServerState>,
    registry: &Registry,
    security: &Arc<Security>,
    pki: &Arc<Pki>,
) {
    spawn(
        app,
        registry,
        approver::Approver::new(app, security.clone()),
    );
    spawn(app, registry, signer::Signer::new(app, pki.clone()));
}

/// What one pass of a controller did with one request.
pub(crate) enum Synced {
    /// Nothing to do, or done before.
    Nothing,
    /// Wrote the request (or lost the race to write it): this version needs no second look.
    Wrote,
}

/// A controller over CertificateSigningRequests: looks at one at a time.
pub(crate) trait CsrController: Send + Sync + 'static {
    /// The post-start hook and log name (`csr-signing-controller`).
    const NAME: &'static str;
    fn sync(
        &self,
        csr: &CertificateSigningRequest,
    ) -> impl Future<Output = Result<Synced, ApiError>> + Send;
}

fn spawn<C: CsrController>(app: &Arc<ServerState>, registry: &Registry, controller: C) {
    let started = app.api.hooks.register(&format!("start-{}", C::NAME));
    let cache = registry.caches.get(CertificateSigningRequest::INFO).clone();
    let stop = app.api.stop_watches.clone();
    tokio::spawn(async move {
        started.store(true, Ordering::Release);
        run(cache, stop, controller).await;
    });
}

/// Runs passes over every request: on start, whenever one changes, and every `RESYNC`.
async fn run<C: CsrController>(
    cache: WatchCache,
    mut stop: tokio::sync::watch::Receiver<bool>,
    controller: C,
) {
    let mut handled: HashMap<String, Revision> = HashMap::new();
    loop {
        // The watch is registered before a pass reads the state, so no change falls
        // between the two; it is only a signal, its frames are dropped.
        let request = WatchRequest {
            namespace: None,
            selector: Selector::everything(),
            start: WatchStart::Now,
            bookmarks: false,
            format: FrameFormat::Json,
        };
        let mut watcher = match cache.watch(request, Instant::now()) {
            Ok(w) => w,
            // Not filled yet (or too many watchers): look again shortly.
            Err(_) => {
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = until_set(&mut stop) => return,
                }
            }
        };
        loop {
            let wait = match pass(&cache, &controller, &mut handled).await {
                Ok(()) => RESYNC,
                Err(e) => {
                    tracing::warn!(controller = C::NAME, error = %e, "pass failed; retrying");
                    RETRY
                }
            };
            tokio::select! {
                _ = watcher.ready() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = until_set(&mut stop) => return,
            }
            while watcher.drain(DRAIN_BYTES, Instant::now()).more {}
            if watcher.is_finished() {
                break;
            }
        }
    }
}

/// One look at every request in the cache. Requests written by an earlier pass are skipped
/// until their version changes; the first error is returned after the others are handled.
async fn pass<C: CsrController>(
    cache: &WatchCache,
    controller: &C,
    handled: &mut HashMap<String, Revision>,
) -> Result<(), ApiError> {
    let everything = Selector::everything();
    let list = cache.list(&svc_core::watch::ListRequest {
        namespace: None,
        at: None,
        start_after: None,
        limit: None,
        selector: &everything,
    })?;
    handled.retain(|name, _| list.items.iter().any(|o| *o.name == **name));
    let mut first_error = None;
    for obj in &list.items {
        if handled.get(&*obj.name) == Some(&obj.resource_version) {
            continue;
        }
        let csr: CertificateSigningRequest =
            serde_json::from_slice(&obj.json).map_err(ApiError::internal)?;
        match controller.sync(&csr).await {
            Ok(Synced::Nothing) => {}
            Ok(Synced::Wrote) => {
                handled.insert(obj.name.to_string(), obj.resource_version);
            }
            Err(e) => {
                tracing::warn!(controller = C::NAME, request = %obj.name, error = %e,
                    "certificate signing request not handled");
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The path of a request's subresource, its name percent-encoded as a path segment.
fn subresource_path(name: &str, sub: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:@".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!(
        "/apis/{}/certificatesigningrequests/{encoded}/{sub}",
        CertificateSigningRequest::INFO.api_version()
    )
}

/// Whether a write lost to another writer (or the request is gone): nothing to retry, the
/// cache will show what happened.
fn lost_race(e: &ApiError) -> bool {
    matches!(e, ApiError::Conflict { .. } | ApiError::PathNotFound(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_in_paths() {
        assert_eq!(
            subresource_path("node-csr:a.b", "status"),
            "/apis/certificates.svc.io/v1/certificatesigningrequests/node-csr:a.b/status"
        );
        assert_eq!(
            subresource_path("a b?#", "approval"),
            "/apis/certificates.svc.io/v1/certificatesigningrequests/a%20b%3F%23/approval"
        );
    }
}
