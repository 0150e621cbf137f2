//! The served kinds, one file each.

mod namespace;
mod service_account;

pub use namespace::{
    FINALIZER_KUBERNETES, Namespace, NamespaceSpec, NamespaceStatus, PHASE_ACTIVE,
    PHASE_TERMINATING,
};
pub use service_account::{LocalObjectReference, ObjectReference, ServiceAccount};
