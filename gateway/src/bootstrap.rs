//! Start-up work and built-in controllers: the system namespaces, the default ServiceAccount
//! of every namespace, and the namespace
//! controller that empties a terminating namespace and then removes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use svc_core::kinds::{FINALIZER_KUBERNETES, Namespace, PHASE_TERMINATING, ServiceAccount};
use svc_core::object;
use svc_core::watch::Selector;
use svc_core::{ApiError, Resource, registry};
use svc_storage::{KeyRange, StoreError};

use crate::app::App;
use crate::kind::{Kind, KindVisitor};
use crate::loopback::Loopback;
use crate::respond;
use crate::rest::write::delete_all_in_namespace;

/// The account every namespace has.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];
/// How often the namespace controller re-checks terminating namespaces without a nudge.
const NAMESPACE_RESYNC: Duration = Duration::from_secs(5);

pub fn start(app: &Arc<App>) {
    let synced = app.hooks.register("start-watch-caches");
    app.caches
        .start(app.store.clone(), app.stop_watches.clone(), synced);

    let done = app.hooks.register("start-system-namespaces-controller");
    let a = app.clone();
    tokio::spawn(async move {
        loop {
            match ensure_system_namespaces(&a).await {
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
    let a = app.clone();
    let started = app.hooks.register("start-service-account-controller");
    tokio::spawn(async move {
        started.store(true, Ordering::Release);
        service_account_controller(a).await;
    });
    let a = app.clone();
    let started = app.hooks.register("start-namespace-controller");
    tokio::spawn(async move {
        started.store(true, Ordering::Release);
        namespace_controller(a).await;
    });
}

async fn ensure_system_namespaces(app: &App) -> Result<(), ApiError> {
    for name in SYSTEM_NAMESPACES {
        let mut ns = Namespace::default();
        ns.set_type_meta();
        ns.metadata.name = (*name).to_string();
        object::prepare_create(&mut ns, &svc_core::ambient::System, &app.validator)?;
        let key = Bytes::from(Namespace::INFO.key("", name));
        let value = Bytes::from(object::encode_for_store(&ns)?);
        match app.store.create(key, value).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(respond::store_error(e)),
        }
    }
    Ok(())
}

/// What every stored namespaced kind has left in `ns` after one round of deletions.
async fn delete_namespace_contents(app: &App, ns: &str) -> Result<usize, ApiError> {
    type Left<'a> = Pin<Box<dyn Future<Output = Result<usize, ApiError>> + Send + 'a>>;
    struct DeleteAll<'a> {
        app: &'a App,
        ns: &'a str,
    }
    impl<'a> KindVisitor for DeleteAll<'a> {
        type Output = Left<'a>;
        fn visit<T: Kind>(self) -> Left<'a> {
            Box::pin(delete_all_in_namespace::<T>(self.app, self.ns))
        }
    }
    let mut left = 0;
    for info in registry::all()
        .iter()
        .filter(|i| i.stored && i.namespaced())
    {
        if let Some(f) = registry::visit(info, DeleteAll { app, ns }) {
            left = f.await?.saturating_add(left);
        }
    }
    Ok(left)
}

/// The least time between two passes of the service-account controller: every commit moves
/// the caches' revision, so passes are spaced rather than run per write.
const SERVICE_ACCOUNT_PASS_SPACING: Duration = Duration::from_millis(200);

/// Every active namespace has a `default` ServiceAccount, recreated if deleted, as
/// Kubernetes' service-account controller keeps it. Writes go through the pipeline.
async fn service_account_controller(app: Arc<App>) {
    let client = Loopback::controller(
        &app,
        "system:svc-controller-manager:serviceaccount-controller",
    );
    let mut stop = app.stop_watches.clone();
    let namespaces = app.caches.get(Namespace::INFO);
    let accounts = app.caches.get(ServiceAccount::INFO);
    loop {
        let seen = namespaces.revision().min(accounts.revision());
        if namespaces.is_ready()
            && accounts.is_ready()
            && let Err(e) = ensure_default_accounts(&app, &client).await
        {
            tracing::warn!(error = %e, "service-account controller");
        }
        tokio::select! {
            _ = tokio::time::sleep(SERVICE_ACCOUNT_PASS_SPACING) => {}
            _ = crate::lifecycle::until_set(&mut stop) => return,
        }
        tokio::select! {
            _ = namespaces.wait_for_revision(seen.saturating_add(1)) => {}
            _ = accounts.wait_for_revision(seen.saturating_add(1)) => {}
            _ = tokio::time::sleep(NAMESPACE_RESYNC) => {}
            _ = crate::lifecycle::until_set(&mut stop) => return,
        }
    }
}

async fn ensure_default_accounts(app: &App, client: &Loopback) -> Result<(), ApiError> {
    let accounts = app.caches.get(ServiceAccount::INFO);
    let snapshot = app.caches.get(Namespace::INFO).snapshot()?;
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

async fn namespace_controller(app: Arc<App>) {
    let mut stop = app.stop_watches.clone();
    loop {
        if let Err(e) = sweep_terminating(&app).await {
            tracing::warn!(error = %e, "namespace controller");
        }
        tokio::select! {
            _ = app.namespace_changed.notified() => {}
            _ = tokio::time::sleep(NAMESPACE_RESYNC) => {}
            _ = crate::lifecycle::until_set(&mut stop) => return,
        }
    }
}

/// Empties each terminating namespace; once nothing is left, drops the `kubernetes`
/// finalizer, which deletes the namespace if no other finalizer holds it.
async fn sweep_terminating(app: &App) -> Result<(), ApiError> {
    let all = app
        .store
        .range(KeyRange::prefix(Namespace::INFO.prefix(None)), None, 0)
        .await
        .map_err(respond::store_error)?;
    for kv in &all.kvs {
        let ns: Namespace = object::decode_from_store(kv)?;
        if ns.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let name = ns.metadata.name.clone();
        let left = delete_namespace_contents(app, &name).await?;
        if left > 0 {
            continue;
        }
        let mut done = ns.clone();
        done.spec.finalizers.retain(|f| f != FINALIZER_KUBERNETES);
        let result = if done.metadata.finalizers.is_empty() && done.spec.finalizers.is_empty() {
            app.store
                .delete(kv.key.clone(), Some(kv.mod_revision))
                .await
                .map(|_| ())
        } else {
            let value = Bytes::from(object::encode_for_store(&done)?);
            app.store
                .update(kv.key.clone(), value, kv.mod_revision)
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => tracing::info!(namespace = %name, "namespace finalized"),
            Err(StoreError::Conflict { .. } | StoreError::NotFound) => {}
            Err(e) => return Err(respond::store_error(e)),
        }
    }
    Ok(())
}
