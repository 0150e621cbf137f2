#!/usr/bin/env bash
# Regenerates the etcd gRPC client code kept in the repository from the .proto subset in
# storage/proto/: storage/src/etcd/pb/*.rs (the etcd backend; svc-loadtest's native etcd
# baseline includes the same source files, since the harness links no crate of ours). A developer tool, not part of the build: it needs `protoc`
# (Debian `protobuf-compiler`) and builds a throwaway generator on tonic-prost-build.
#
#   scripts/gen-etcd-proto.sh           rewrite storage/src/etcd/pb/
#   scripts/gen-etcd-proto.sh --check   regenerate into a temporary directory and fail if the
#                                       committed files differ (what scripts/test.sh runs)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

protoc=${PROTOC:-$(command -v protoc || true)}
if [ -z "$protoc" ] || [ ! -x "$protoc" ]; then
  echo "gen-etcd-proto: protoc not found (install protobuf-compiler or set PROTOC)" >&2
  exit 3
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The generator: exact versions, so the same inputs always give the same code.
mkdir -p "$work/gen/src" "$work/out"
cat >"$work/gen/Cargo.toml" <<'EOF'
[package]
name = "svc-gen-etcd-proto"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
prost-build = "=0.14.4"
tonic-build = { version = "=0.14.9", default-features = false }
tonic-prost-build = "=0.14.9"

[workspace]
EOF
cat >"$work/gen/src/main.rs" <<'EOF'
//! Compiles etcd's .proto subset to Rust: prost messages and tonic clients (no servers, no
//! transport helpers). Bytes fields stay `Vec<u8>`: a `Bytes` slice of the decoded buffer
//! would keep a whole list response alive for as long as any one value of it is kept.
fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(proto_dir), Some(out_dir)) = (args.next(), args.next()) else {
        panic!("usage: svc-gen-etcd-proto PROTO_DIR OUT_DIR");
    };
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(&out_dir)
        .compile_protos(
            &[
                format!("{proto_dir}/etcdserverpb/rpc.proto"),
                format!("{proto_dir}/mvccpb/kv.proto"),
            ],
            &[proto_dir.clone()],
        )
}
EOF

# Its build is cached under target/ (a minute the first time, nothing afterwards).
CARGO_TARGET_DIR="$root/target/gen-etcd-proto" \
  cargo build --quiet --manifest-path "$work/gen/Cargo.toml"
PROTOC="$protoc" "$root/target/gen-etcd-proto/debug/svc-gen-etcd-proto" \
  "$root/storage/proto" "$work/out"

# Each file gets its `//!` line and the allowances generated code needs, then rustfmt (so
# `cargo fmt` leaves it alone).
header() {
  local package=$1 proto=$2
  echo "//! etcd's \`$package\` protobuf package (generated from \`storage/proto/$proto\` by \`scripts/gen-etcd-proto.sh\`; do not edit)."
  echo "#![allow(clippy::all, clippy::pedantic, rustdoc::all)]"
  echo
}
mkdir -p "$work/pb"
{ header etcdserverpb etcdserverpb/rpc.proto; cat "$work/out/etcdserverpb.rs"; } >"$work/pb/etcdserverpb.rs"
{ header mvccpb mvccpb/kv.proto; cat "$work/out/mvccpb.rs"; } >"$work/pb/mvccpb.rs"
rustfmt --config-path "$root/rustfmt.toml" "$work/pb/etcdserverpb.rs" "$work/pb/mvccpb.rs"

targets=("storage/src/etcd/pb")
if $check; then
  for t in "${targets[@]}"; do
    if ! diff -ru "$root/$t" "$work/pb"; then
      echo "gen-etcd-proto: $t/ is not what storage/proto/ generates; run scripts/gen-etcd-proto.sh" >&2
      exit 1
    fi
    echo "gen-etcd-proto: $t/ matches storage/proto/"
  done
else
  for t in "${targets[@]}"; do
    mkdir -p "$root/$t"
    cp "$work/pb/etcdserverpb.rs" "$work/pb/mvccpb.rs" "$root/$t/"
    echo "gen-etcd-proto: wrote $t/{etcdserverpb,mvccpb}.rs"
  done
fi
