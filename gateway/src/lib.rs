//! svc-gateway: the HTTP edge of the svc API server.

pub mod pki;
