//! The gateway end to end, through real sockets and real clients, as one test binary (one
//! link instead of one per file): each module is one area of the API, `support` is what they
//! share (an in-process server and HTTP client, the binary as a child process, kubectl).

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
mod h2_watch;
mod health;
mod hostile;
mod identity;
mod jwt;
mod kubectl_writes;
mod list_watch;
mod media;
mod metrics;
mod patch;
mod props;
mod tracing;
mod validate_config;
mod writes;
