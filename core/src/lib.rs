//! svc-core: the object model and API machinery, free of I/O.
//!
//! Types and metadata rules (`meta`, `object`, `kinds`, `resource`, `registry`), `Status`
//! errors, validation, label and field selectors, strict decoding (`strict`: unknown and
//! duplicate fields with their paths, `fieldValidation`), codecs (`codec`: JSON, YAML, protobuf,
//! CBOR), patches and server-side apply (`patch`), the watch cache's structures (`watch`),
//! PEM and X.509 checks (`pem`), and the key layout objects use in the store.
//!
//! **Invariant:** core knows no HTTP, no sockets and no disks, and never calls the store; of
//! our crates it depends only on the `svc-storage` contract types and on `svc-cel` (webhook
//! match conditions). Configuration (`svc-config`) stands above it.

pub mod ambient;
pub mod codec;
pub mod kinds;
pub mod meta;
pub mod object;
pub mod patch;
pub mod pem;
pub mod registry;
pub mod resource;
pub mod selector;
pub mod status;
pub mod strict;
pub mod table;
pub mod user;
pub mod validation;
pub mod watch;

pub use meta::{ListMeta, ObjectMeta, Time};
pub use resource::{Resource, ResourceInfo, Scope};
pub use status::{ApiError, Status};
