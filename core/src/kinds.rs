//! The served kinds, one file each.

mod event;
mod namespace;
mod service_account;

pub use event::{EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING, Event, EventSeries, EventSource};
pub use namespace::{
    FINALIZER_KUBERNETES, Namespace, NamespaceSpec, NamespaceStatus, PHASE_ACTIVE,
    PHASE_TERMINATING,
};
pub use service_account::{LocalObjectReference, ObjectReference, ServiceAccount};
