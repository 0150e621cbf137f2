//! svc-gateway: the HTTP edge of the svc API server, built in layers. Each layer is a folder
//! that uses only the layers before it (`gateway/tests/layers.rs` checks this, and that no
//! layer's modules depend on each other in a circle):
//!
//! 1. `base`: flags, feature gates, query strings, routes, lifecycle, deadlines;
//! 2. `observe`: metrics and traces;
//! 3. `outbound`: PKI, egress, the webhook client, proxy mode's upstream protocol (no cache);
//! 4. `registry`: the watch caches of both modes and their one fill loop, the decision to
//!    serve a proxy's read from its cache or pass it upstream, admission, typed operations
//!    over the store;
//! 5. `security`: authentication, authorization, audit;
//! 6. `http`: negotiation, responses, limits, REST handlers, discovery, OpenAPI, health,
//!    proxy mode's cached reads and pass-through;
//! 7. `serve`: server state, listeners, connections, the request pipeline, loopback;
//! 8. `controllers`: the built-in controllers (namespaces, service accounts, CSRs);
//! 9. `run`: starting and stopping a whole server, standalone or a proxy.
//!
//! The crate root defines nothing.
//!
//! **Invariant:** the gateway reaches storage only through the `svc_storage::Store` contract.

pub mod base;
pub mod controllers;
pub mod http;
pub mod observe;
pub mod outbound;
pub mod registry;
pub mod run;
pub mod security;
pub mod serve;
