//! Start-up work and built-in controllers: the system namespaces, the default ServiceAccount
//! of every namespace, and the namespace
//! controller that empties a terminating namespace and then removes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use svc_core::kinds::{FINALIZER_KUBERNETES, Namespace, PHASE_TERMINATING, ServiceAccount};
use svc_core::object;
use svc_core::watch::Selector;
use svc_core::{ApiError, Resource, ResourceInfo, registry};
use svc_storage::{KeyRange, StoreError};

use crate::registry::errors;
use crate::registry::state::Registry;
use crate::serve::app::ServerState;
use crate::serve::loopback::Loopback;

/// The account every namespace has.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];
/// How often the namespace controller re-checks terminating namespaces without a nudge.
const NAMESPACE_RESYNC: Duration = Duration::from_secs(5);

pub fn start(app: &Arc<ServerState>, registry: &Arc<Registry>) {
    let synced = app.api.hooks.register("start-watch-caches");
    registry
        .caches
        .start(registry.store.clone(), app.api.stop_watches.clone(), synced);

    let done = app.api.hooks.register("start-system-namespaces-controller");
    let o = registry.clone();
    tokio::spawn(async move {
        loop {
            match ensure_system_namespaces(&o).await {
                Ok(()) => {
                    done.store(true, Ordering::Release);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "creating system namespaces; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    let (a, o) = (app.clone(), registry.clone());
    let started = app.api.hooks.register("start-service-account-controller");
    tokio::spawn(async move {
        started.store(true, Ordering::Release);
        service_account_controller(a, o).await;
    });
    let (a, o) = (app.clone(), registry.clone());
    let started = app.api.hooks.register("start-namespace-controller");
    tokio::spawn(async move {
        started.store(true, Ordering::Release);
        namespace_controller(a, o).await;
    });
}

async fn ensure_system_namespaces(registry: &Registry) -> Result<(), ApiError> {
    for name in SYSTEM_NAMESPACES {
        let mut ns = Namespace::default();
        ns.set_type_meta();
        ns.metadata.name = (*name).to_string();
        object::prepare_create(&mut ns, &svc_core::ambient::System, &registry.validator)?;
        let key = Bytes::from(Namespace::INFO.key("", name));
        let value = Bytes::from(object::encode_for_store(&ns)?);
        match registry.store.create(key, value).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(errors::store_error(e)),
        }
    }
    Ok(())
}

/// Who deletes a terminating namespace's contents, as Kubernetes' namespace controller is
/// named: its requests go through the whole pipeline (authorization, admission, audit,
/// limits and metrics) like any client's.
const NAMESPACE_CONTROLLER: &str = "system:svc-controller-manager:namespace-controller";

/// The collection path of a namespaced kind in `ns`.
fn collection_path(info: &ResourceInfo, ns: &str) -> String {
    let root = if info.group.is_empty() {
        format!("/api/{}", info.version)
    } else {
        format!("/apis/{}/{}", info.group, info.version)
    };
    format!("{root}/namespaces/{ns}/{}", info.plural)
}

/// One round of deletions in `ns` (a `deletecollection` of every stored namespaced kind),
/// and what is left after it: objects that finalizers still hold.
async fn delete_namespace_contents(
    registry: &Registry,
    client: &Loopback,
    ns: &str,
) -> Result<usize, ApiError> {
    let mut left = 0usize;
    for info in registry::all()
        .iter()
        .filter(|i| i.stored && i.namespaced())
    {
        let reply = client.delete(&collection_path(info, ns)).await?;
        reply.into_result::<serde_json::Value>()?;
        let remaining = registry
            .store
            .range(KeyRange::prefix(info.prefix(Some(ns))), None, 0)
            .await
            .map_err(errors::store_error)?;
        left = left.saturating_add(remaining.kvs.len());
    }
    Ok(left)
}

/// The least time between two passes of the service-account controller: every commit moves
/// the caches' revision, so passes are spaced rather than run per write.
const SERVICE_ACCOUNT_PASS_SPACING: Duration = Duration::from_millis(200);

/// Every active namespace has a `default` ServiceAccount, recreated if deleted, as
/// Kubernetes' service-account controller keeps it. Writes go through the pipeline.
async fn service_account_controller(app: Arc<ServerState>, registry: Arc<Registry>) {
    let client = Loopback::controller(
        &app,
        "system:svc-controller-manager:serviceaccount-controller",
    );
    let mut stop = app.api.stop_watches.clone();
    let namespaces = registry.caches.get(Namespace::INFO);
    let accounts = registry.caches.get(ServiceAccount::INFO);
    loop {
        let seen = namespaces.revision().min(accounts.revision());
        if namespaces.is_ready()
            && accounts.is_ready()
            && let Err(e) = ensure_default_accounts(&registry, &client).await
        {
            tracing::warn!(error = %e, "service-account controller");
        }
        tokio::select! {
            _ = tokio::time::sleep(SERVICE_ACCOUNT_PASS_SPACING) => {}
            _ = crate::base::lifecycle::until_set(&mut stop) => return,
        }
        tokio::select! {
            _ = namespaces.wait_for_revision(seen.saturating_add(1)) => {}
            _ = accounts.wait_for_revision(seen.saturating_add(1)) => {}
            _ = tokio::time::sleep(NAMESPACE_RESYNC) => {}
            _ = crate::base::lifecycle::until_set(&mut stop) => return,
        }
    }
}

async fn ensure_default_accounts(registry: &Registry, client: &Loopback) -> Result<(), ApiError> {
    let accounts = registry.caches.get(ServiceAccount::INFO);
    let snapshot = registry.caches.get(Namespace::INFO).snapshot()?;
    let all = snapshot.list(
        &KeyRange::prefix(Namespace::INFO.prefix(None)),
        None,
        None,
        &Selector::everything(),
    );
    for ns in &all.items {
        // A terminating namespace (its phase is cached with it, no decoding) gets no new
        // account; the write would be refused anyway.
        let terminating = ns
            .fields
            .iter()
            .any(|(f, v)| *f == "status.phase" && v == PHASE_TERMINATING);
        if terminating {
            continue;
        }
        let name = &*ns.name;
        let key = ServiceAccount::INFO.key(name, DEFAULT_SERVICE_ACCOUNT);
        if accounts.get(&key)?.0.is_some() {
            continue;
        }
        let path = format!("/api/v1/namespaces/{name}/serviceaccounts");
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_SERVICE_ACCOUNT},
        });
        let reply = client.create(&path, &body).await?;
        match reply.status {
            // Created, raced by another gateway, or the namespace began terminating.
            s if s.is_success() => {
                tracing::debug!(namespace = %name, "default service account created");
            }
            StatusCode::CONFLICT | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND => {}
            other => {
                return Err(ApiError::internal(format!(
                    "creating the default service account in {}: {other}: {}",
                    name, reply.body
                )));
            }
        }
    }
    Ok(())
}

async fn namespace_controller(app: Arc<ServerState>, registry: Arc<Registry>) {
    let mut stop = app.api.stop_watches.clone();
    let client = Loopback::controller(&app, NAMESPACE_CONTROLLER);
    loop {
        if let Err(e) = sweep_terminating(&registry, &client).await {
            tracing::warn!(error = %e, "namespace controller");
        }
        tokio::select! {
            _ = registry.namespace_changed.notified() => {}
            _ = tokio::time::sleep(NAMESPACE_RESYNC) => {}
            _ = crate::base::lifecycle::until_set(&mut stop) => return,
        }
    }
}

/// Empties each terminating namespace; once nothing is left, drops the `kubernetes`
/// finalizer, which deletes the namespace if no other finalizer holds it.
async fn sweep_terminating(registry: &Registry, client: &Loopback) -> Result<(), ApiError> {
    let all = registry
        .store
        .range(KeyRange::prefix(Namespace::INFO.prefix(None)), None, 0)
        .await
        .map_err(errors::store_error)?;
    for kv in &all.kvs {
        let ns: Namespace = object::decode_from_store(kv)?;
        if ns.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let name = ns.metadata.name.clone();
        let left = delete_namespace_contents(registry, client, &name).await?;
        if left > 0 {
            continue;
        }
        let mut done = ns.clone();
        done.spec.finalizers.retain(|f| f != FINALIZER_KUBERNETES);
        let result = if done.metadata.finalizers.is_empty() && done.spec.finalizers.is_empty() {
            registry
                .store
                .delete(kv.key.clone(), Some(kv.mod_revision))
                .await
                .map(|_| ())
        } else {
            let value = Bytes::from(object::encode_for_store(&done)?);
            registry
                .store
                .update(kv.key.clone(), value, kv.mod_revision)
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => tracing::info!(namespace = %name, "namespace finalized"),
            Err(StoreError::Conflict { .. } | StoreError::NotFound) => {}
            Err(e) => return Err(errors::store_error(e)),
        }
    }
    Ok(())
}
