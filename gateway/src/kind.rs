//! The served-kind bound every handler and encoder is written over: the object model of
//! `svc_core` plus its protobuf form. A leaf: it knows nothing of requests or routes.

use svc_core::Resource;
use svc_core::codec::ProtoKind;

/// Every served kind: the object model plus its protobuf form.
pub trait Kind: Resource + ProtoKind {}
impl<T: Resource + ProtoKind> Kind for T {}
