//! Typed operations over the store and the object model, below HTTP: the watch caches and
//! admission (plugins and webhooks). Names no http, hyper or response type; answers are typed
//! values and `ApiError`. Uses `base`, `observe` and `outbound`.

pub mod admission;
pub mod caches;
pub mod delegate;
pub mod errors;
pub mod list;
pub mod read;
pub mod state;
pub mod watch;
pub mod write;
