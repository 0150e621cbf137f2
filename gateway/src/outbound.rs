//! Everything that dials out or holds key material: the PKI (certificates, CSR signing, TLS
//! configuration), the egress selector (direct or through an HTTP CONNECT tunnel), the
//! HTTPS client that webhooks and issuers are called with, the upstream API server of proxy
//! mode, and the upstream's protocols (`upstream`). Uses `base` and `observe`.

pub mod client;
pub mod egress;
pub mod pki;
pub mod upstream;
