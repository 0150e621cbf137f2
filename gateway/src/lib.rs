//! svc-gateway: the HTTP edge of the svc API server.
//!
//! Listeners and TLS (`server`), routing (`router`), authentication and authorization
//! (`auth`), REST handlers written once over every kind (`rest`), watch streams (`watch`),
//! discovery, health, metrics, and the built-in controllers (`bootstrap`, `controllers`). Errors become
//! `Status` responses in exactly one place (`respond`).
//!
//! **Invariant:** the gateway reaches storage only through the `svc_storage::Store` contract.

pub mod admission;
pub mod app;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod bootstrap;
pub mod caches;
pub mod client;
pub mod config;
pub mod conn_limits;
pub mod controllers;
pub mod discovery;
pub mod egress;
pub mod features;
pub mod h2conn;
pub mod health;
pub mod jwt;
pub mod kind;
pub mod lifecycle;
pub mod limits;
pub mod loopback;
pub mod metrics;
pub mod negotiate;
pub mod openapi;
pub mod pipeline;
pub mod pki;
pub mod query;
pub mod reload;
pub mod respond;
pub mod rest;
pub mod router;
pub mod server;
pub mod tokens;
pub mod trace;
pub mod validate;

pub use config::Options;
pub use server::{ServerHandle, start};

/// Deadlines without the panic of `Instant + Duration` on overflow: a duration too large to
/// add (a huge configured timeout) means about a century from now, i.e. never.
pub(crate) trait Later: Copy {
    fn checked(self, after: std::time::Duration) -> Option<Self>;

    fn later(self, after: std::time::Duration) -> Self {
        const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
        self.checked(after)
            .or_else(|| self.checked(CENTURY))
            .unwrap_or(self)
    }
}

impl Later for std::time::Instant {
    fn checked(self, after: std::time::Duration) -> Option<Self> {
        self.checked_add(after)
    }
}

impl Later for tokio::time::Instant {
    fn checked(self, after: std::time::Duration) -> Option<Self> {
        self.checked_add(after)
    }
}
