//! Typed reads of one object: a get at the store's current revision, or, with a
//! `resourceVersion`, once the store has reached it ("not older than"). Lists and watches
//! are served from the watch caches (`caches`).

use bytes::Bytes;
use svc_core::ApiError;
use svc_core::registry::Kind;
use svc_storage::Revision;

use crate::registry::caches::freshness::wait_for_revision;
use crate::registry::state::Registry;
use crate::registry::write::read_current;

/// `T`'s object `name` in `ns`, read no older than `min_revision` when one is given.
pub async fn get<T: Kind>(
    registry: &Registry,
    ns: &str,
    name: &str,
    min_revision: Option<Revision>,
) -> Result<T, ApiError> {
    if let Some(rv) = min_revision {
        wait_for_revision(registry.store.as_ref(), rv).await?;
    }
    let key = Bytes::from(T::INFO.key(ns, name));
    read_current::<T>(registry, &key, name)
        .await
        .map(|(obj, _)| obj)
}
