//! Storage failures as API errors: what the registry's callers see when the store fails in a
//! way no operation turned into something more specific.

use svc_core::ApiError;
use svc_storage::StoreError;

/// Maps a storage failure that the handler did not turn into something more specific.
/// Conflicts and not-found are handled where the resource is known; this is the remainder.
pub fn store_error(err: StoreError) -> ApiError {
    match err {
        StoreError::Compacted {
            requested,
            compacted,
        } => ApiError::Expired(format!(
            "The resourceVersion for the provided list is too old: requested {requested}, \
             compacted at {compacted}"
        )),
        StoreError::FutureRevision { requested, current } => {
            ApiError::too_large_resource_version(requested, current)
        }
        StoreError::Unavailable(msg) => {
            ApiError::ServiceUnavailable(format!("storage unavailable: {msg}"))
        }
        StoreError::Closed => ApiError::ServiceUnavailable("storage is shutting down".into()),
        StoreError::Corrupt { location, detail } => {
            ApiError::Internal(format!("stored object at {location} is corrupt: {detail}"))
        }
        other => ApiError::Internal(other.to_string()),
    }
}
