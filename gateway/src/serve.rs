//! Connections and the request pipeline: the server state (`app`), TLS listeners, the
//! HTTP/1.1 and h2 connection drivers, the per-request pipeline (authenticate, authorize,
//! limit, route; in proxy mode authenticate, limit, pass upstream) and the in-process
//! loopback client. Names no handler type.

pub mod app;
pub mod audited;
pub mod bulk;
pub mod conn_limits;
pub mod h1conn;
pub mod h2conn;
pub mod h2ledger;
pub mod h2wire;
pub mod held;
pub mod loopback;
pub mod pipeline;
pub mod proxied;
pub mod request;
pub mod seats;
pub mod server;
