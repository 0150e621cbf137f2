//! The served kinds, one file each.

pub mod admission_registration;
mod authentication;
pub mod certificate_signing_request;
mod event;
mod namespace;
mod secret;
mod service_account;

pub use admission_registration::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
pub use certificate_signing_request::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
pub use event::{EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING, Event, EventSeries, EventSource};
pub use namespace::{
    FINALIZER_KUBERNETES, Namespace, NamespaceSpec, NamespaceStatus, PHASE_ACTIVE,
    PHASE_TERMINATING,
};
pub use service_account::{LocalObjectReference, ObjectReference, ServiceAccount};
pub mod auth {
    //! Constants of the authentication group.
    pub use super::authentication::{
        DEFAULT_EXPIRATION_SECONDS, GROUP, KUBERNETES_GROUP, MIN_EXPIRATION_SECONDS,
        is_authentication_v1,
    };
}
pub use authentication::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenRequestStatus, TokenReview,
    TokenReviewSpec, TokenReviewStatus,
};
pub use secret::{Secret, TYPE_OPAQUE};
