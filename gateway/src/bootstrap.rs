//! Start-up work and built-in controllers: the system namespaces, and the namespace
//! controller that empties a terminating namespace and then removes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use svc_core::kinds::{FINALIZER_KUBERNETES, Namespace, ServiceAccount};
use svc_core::object;
use svc_core::{ApiError, Resource};
use svc_storage::{KeyRange, StoreError};

use crate::app::App;
use crate::respond;
use crate::rest::write::delete_all_in_namespace;

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
        object::prepare_create(&mut ns, &app.validator)?;
        let key = Bytes::from(Namespace::INFO.key("", name));
        let value = Bytes::from(object::encode_for_store(&ns)?);
        match app.store.create(key, value).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(respond::store_error(e)),
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
        // Every namespaced kind is listed here.
        let left = delete_all_in_namespace::<ServiceAccount>(app, &name).await?;
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
