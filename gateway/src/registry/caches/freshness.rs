//! Freshness waits: a read that needs a revision waits (briefly) for the store or the watch
//! cache to reach it, and answers 504 `Too large resource version` when it does not.

use std::time::Duration;

use svc_core::ApiError;
use svc_core::watch::WatchCache;
use svc_storage::Store;

use crate::base::deadline::Deadline;
use crate::registry::errors;

/// How long a read for a future resourceVersion waits for the store to reach it before 504.
const FUTURE_RV_WAIT: Duration = Duration::from_secs(3);

/// How long a read waits for the watch cache to reach the revision it needs before 504.
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// Waits until `cache` has applied `revision`: 504 `Too large resource version` after
/// `FRESHNESS_WAIT` (the revision may not exist yet, or the store is slow).
pub async fn wait_for_cache(cache: &WatchCache, revision: i64) -> Result<(), ApiError> {
    match tokio::time::timeout(FRESHNESS_WAIT, cache.wait_for_revision(revision)).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::too_large_resource_version(
            revision,
            cache.revision(),
        )),
    }
}

/// "Most Recent": the cache is brought up to the store's current revision first, so the
/// answer is as fresh as a quorum read would be.
pub async fn wait_for_consistent(store: &dyn Store, cache: &WatchCache) -> Result<(), ApiError> {
    let current = store
        .current_revision()
        .await
        .map_err(errors::store_error)?;
    wait_for_cache(cache, current).await
}

/// Waits (briefly) until the store has reached `rv`; a version from the future gets 504
/// `Too large resource version`, as Kubernetes answers.
pub async fn wait_for_revision(store: &dyn Store, rv: i64) -> Result<i64, ApiError> {
    let deadline = tokio::time::Instant::now().later(FUTURE_RV_WAIT);
    loop {
        let current = store
            .current_revision()
            .await
            .map_err(errors::store_error)?;
        if current >= rv {
            return Ok(current);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::too_large_resource_version(rv, current));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
