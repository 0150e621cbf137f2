#!/usr/bin/env bash
# The project's one test command (CI runs exactly this): installs what the tests need on a
# fresh machine, then checks formatting, lints, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# A CI run builds once from scratch: incremental compilation would only add gigabytes of
# caches to the target directory.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
fi

# System packages the tests drive: kubectl (real-client tests), curl, etcd (the etcd backend's
# conformance and multi-gateway tests start their own servers), and protoc (only for the check
# that the etcd client code in storage/src/etcd/pb/ is what storage/proto/ generates; the
# build itself needs no protoc, which the protoc-free build below proves), and tinyproxy (a
# real HTTP CONNECT tunnel server for the egress selector tests).
missing=()
command -v kubectl >/dev/null 2>&1 || missing+=(kubectl)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# curl: an unauthenticated probe of /readyz, as a load balancer sends it (e2e jwt).
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v tinyproxy >/dev/null 2>&1 || missing+=(tinyproxy)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# The official Kubernetes Python client (real-client tests, and the interop proxy tests).
if ! python3 -c 'import kubernetes' >/dev/null 2>&1; then
  echo "installing: python kubernetes client"
  python3 -m pip install -q --disable-pip-version-check kubernetes
fi

# The official JavaScript client (@kubernetes/client-node) is not installed here: the interop
# proxy test that drives it runs `npm ci` in interop/proxy/clients/node on first use, so Node
# (20 or later) and npm must be on the PATH.

# Python's Prometheus client: gateway/tests/metrics.rs parses /metrics with its parser.
if ! python3 -c 'import prometheus_client' >/dev/null 2>&1; then
  echo "installing: python prometheus_client"
  python3 -m pip install -q --disable-pip-version-check prometheus_client
fi

# Schemathesis, the API fuzzer gateway/tests/e2e/fuzz_api.rs runs against the server (pinned:
# its checks and command line change between releases).
if [ "$(schemathesis --version 2>/dev/null)" != "schemathesis, version 4.32.5" ]; then
  echo "installing: schemathesis 4.32.5"
  python3 -m pip install -q --disable-pip-version-check 'schemathesis==4.32.5'
fi

cargo fmt --all -- --check

# Dependency shape: nothing in the server's build runs a protobuf code generator (they need
# protoc), svc-core, svc-cel and svc-config see only the Store contract, none of the
# backends' crates, and the three point one way (cel, then core, then config).
if cargo tree -p svc-gateway -e normal,build --prefix none |
  grep -E '^(prost-build|tonic-build|tonic-prost-build|protobuf-src) '; then
  echo "svc-gateway's build depends on a protobuf code generator (see above)" >&2
  exit 1
fi
for krate in svc-cel svc-core svc-config; do
  if cargo tree -p "$krate" -e normal --prefix none | grep -E '^(redb|tonic|tonic-prost|h2|hyper|crc32fast) '; then
    echo "$krate depends on a storage backend's crates (see above); it needs only the contract" >&2
    exit 1
  fi
done
# The sans-IO crates point one way: cel stands on nothing of ours, core never links config.
if cargo tree -p svc-cel -e normal --prefix none | grep -E '^svc-(core|config|storage) '; then
  echo "svc-cel depends on another crate of ours (see above)" >&2
  exit 1
fi
if cargo tree -p svc-core -e normal --prefix none | grep -E '^svc-config '; then
  echo "svc-core depends on svc-config (see above)" >&2
  exit 1
fi

# The etcd client code kept in the repository matches its .proto files.
if command -v protoc >/dev/null 2>&1; then
  scripts/gen-etcd-proto.sh --check
else
  echo "skipping the generated etcd code check: no protoc"
fi

# A fresh machine needs only the Rust toolchain: build the server with protoc out of reach (a
# PATH of links to everything but protoc), then start it on an empty data directory and use it
# with kubectl. On a fresh machine this is the first build, so every build script runs here;
# the dev-profile artefacts are then reused by the steps below.
protoc_free_smoke_test() {
  local dir bin pid kubeconfig ready=false
  dir=$(mktemp -d)
  mkdir "$dir/bin"
  local IFS=:
  for path_dir in $PATH; do
    for tool in "$path_dir"/*; do
      local name=${tool##*/}
      case "$name" in protoc | protoc-*) continue ;; esac
      [ -x "$tool" ] && [ ! -e "$dir/bin/$name" ] && ln -s "$tool" "$dir/bin/$name"
    done
  done
  unset IFS
  if PATH="$dir/bin" command -v protoc >/dev/null; then
    echo "protoc is still on the PATH" >&2
    return 1
  fi
  PATH="$dir/bin" PROTOC=/nonexistent cargo build -p svc-gateway --bin svc-gateway
  bin="${CARGO_TARGET_DIR:-target}/debug/svc-gateway"
  kubeconfig="$dir/data/admin.kubeconfig"
  # Port 0: the kernel picks a free port, and the admin kubeconfig names it.
  "$bin" --data-dir "$dir/data" --bind-address 127.0.0.1 --secure-port 0 >"$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    if [ -f "$kubeconfig" ] && kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; then
      ready=true
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if $ready && kubectl --kubeconfig "$kubeconfig" get namespaces; then
    kill -TERM "$pid"
    wait "$pid"
    rm -rf "$dir"
    echo "protoc-free build: the server started and served kubectl"
  else
    echo "the protoc-free server did not serve kubectl; its log:" >&2
    cat "$dir/server.log" >&2
    kill -KILL "$pid" 2>/dev/null || true
    return 1
  fi
}
protoc_free_smoke_test

cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace

# Kubernetes beside us (interop/): gofmt and go vet on the Go module and its build modules,
# then the client-go conformance tests against a real kube-apiserver (built from the Go module
# proxy on first use and cached by version in ~/.cache/svc-interop) and against this gateway.
# Ends with its own "N passed, N failed" line.
if ! command -v go >/dev/null 2>&1; then
  echo "interop/ needs Go (1.26 or later) on the PATH" >&2
  exit 1
fi
unformatted=$(gofmt -l interop)
if [ -n "$unformatted" ]; then
  echo "gofmt -l interop lists: $unformatted" >&2
  exit 1
fi
for mod in $(find interop -name go.mod -exec dirname {} \;); do
  if compgen -G "$mod/*.go" >/dev/null || [ -n "$(find "$mod" -mindepth 2 -name '*.go' -print -quit)" ]; then
    (cd "$mod" && go vet ./...)
  fi
done
SVC_GATEWAY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/svc-gateway" interop/run.sh
