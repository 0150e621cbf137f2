//! The built-in controllers, which Kubernetes runs in its controller manager and every gateway
//! runs here: the system namespaces, each namespace's `default` ServiceAccount and the
//! namespace sweep (`bootstrap`), and the CertificateSigningRequest approver and signer
//! (`csr`). They call the registry or the loopback pipeline, never the HTTP handlers.

pub mod bootstrap;
pub mod csr;
