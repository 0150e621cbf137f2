//! etcd's v3 gRPC API (the subset in `storage/proto/`): prost messages and tonic clients,
//! generated ahead of time by `scripts/gen-etcd-proto.sh` so that building needs no `protoc`.
//!
//! Package, service and field names and numbers are etcd's, so paths such as
//! `/etcdserverpb.KV/Txn` and the bytes on the wire are what etcd expects.

pub mod etcdserverpb;
pub mod mvccpb;
