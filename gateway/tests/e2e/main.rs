//! The gateway end to end, through real sockets and real clients, as one test binary (one
//! link instead of one per file): each module is one area of the API, `support` is what they
//! share (an in-process server and HTTP client, the binary as a child process, kubectl).
// Test and harness code: a panic on a broken expectation is the point, and arithmetic and
// indexing on test data are checked by the assertions that follow.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

mod support;

mod admission;
mod admission_webhooks;
mod api;
mod audit;
mod authorization;
mod authz_webhook;
mod certificates;
mod clients;
mod crash;
mod egress;
mod etcd_gateways;
mod events;
mod fairness;
mod fanout;
mod faults;
mod fuzz_api;
mod h2_conformance;
mod h2_watch;
mod health;
mod hostile;
mod http1;
mod identity;
mod jwt;
mod kubectl_writes;
mod list_watch;
mod media;
mod metrics;
mod patch;
mod props;
mod proxy;
mod proxy_cache;
mod proxy_faults;
mod tracing;
mod validate_config;
mod watch_guarantees;
mod writes;
