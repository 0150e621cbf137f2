#!/usr/bin/env bash
# The project's one test command (CI runs exactly this): installs what the tests need on a
# fresh machine, then checks formatting, lints, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# System packages the tests drive: kubectl (real-client tests), etcd (the etcd backend's
# conformance and multi-gateway tests start their own servers), and protoc (the etcd
# client's build compiles etcd's gRPC protos).
missing=()
command -v kubectl >/dev/null 2>&1 || missing+=(kubectl)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# The official Kubernetes Python client (real-client tests).
if ! python3 -c 'import kubernetes' >/dev/null 2>&1; then
  echo "installing: python kubernetes client"
  python3 -m pip install -q --disable-pip-version-check kubernetes
fi

# Python's Prometheus client: gateway/tests/metrics.rs parses /metrics with its parser.
if ! python3 -c 'import prometheus_client' >/dev/null 2>&1; then
  echo "installing: python prometheus_client"
  python3 -m pip install -q --disable-pip-version-check prometheus_client
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
