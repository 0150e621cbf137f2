//! The served kinds, one file each.

pub mod certificate_signing_request;
mod namespace;
mod service_account;

pub use certificate_signing_request::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
pub use namespace::{
    FINALIZER_KUBERNETES, Namespace, NamespaceSpec, NamespaceStatus, PHASE_ACTIVE,
    PHASE_TERMINATING,
};
pub use service_account::{LocalObjectReference, ObjectReference, ServiceAccount};
