//! The served-kind bound every handler and encoder is written over: the object model of
//! `svc_core` plus its protobuf form (the registry's `Kind`). A leaf: it knows nothing of
//! requests or routes.

pub use svc_core::registry::{Kind, KindVisitor};
