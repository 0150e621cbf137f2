//! svc-core: the object model and API machinery, free of I/O.
//!
//! Types and metadata rules, `Status` errors, validation, label and field selectors, the
//! resource registry, and the key layout objects use in the store.
//!
//! **Invariant:** core knows no HTTP and no disks; it depends only on the `svc-storage`
//! contract types.

pub mod cel;
pub mod codec;
pub mod config;
pub mod kinds;
pub mod meta;
pub mod object;
pub mod patch;
pub mod rate_limit;
pub mod registry;
pub mod resource;
pub mod selector;
pub mod status;
pub mod table;
pub mod user;
pub mod validation;
pub mod watch;

pub use meta::{ListMeta, ObjectMeta, Time};
pub use resource::{Resource, ResourceInfo, Scope};
pub use status::{ApiError, Status};
