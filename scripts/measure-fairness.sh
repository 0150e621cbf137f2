#!/usr/bin/env bash
# Measures per-user fairness under overload with `svc-loadtest fairness`: a writer (user B)
# creating at a fixed rate, alone and then beside a hammer (user A) sending unpaged lists of
# OBJECTS ServiceAccounts from CLIENTS connections. Both users are service accounts (neither is
# in system:masters, which is exempt from the limits), authorized by a Webhook authorizer that
# allows everything (`svc-loadtest webhook-server`; its TLS certificate comes from
# scripts/measure_issuer.py). The gateway runs with a small `--max-requests-inflight`, so the
# hammer queues. The writer runs on its own thread in the load generator; the hammer is a
# child process pinned to HAMMER_CPUS (default: the last core) at niceness HAMMER_NICE
# (default 10), listing over HTTP/1.1 (HAMMER_H2=1: over h2). Release binaries in BIN
# (default target/release; GW overrides the gateway's, e.g. to compare two builds; GW_ARGS
# adds flags to it); the report in OUT.
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/measure-fairness.sh        # OUT=/tmp/svc-fairness OBJECTS=10000 CLIENTS=32
#                                           # RATE=50 DUR=30s INFLIGHT=8 QUEUE=8
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-fairness}
OBJECTS=${OBJECTS:-10000}
CLIENTS=${CLIENTS:-32}
RATE=${RATE:-50}
DUR=${DUR:-30s}
INFLIGHT=${INFLIGHT:-8}
QUEUE=${QUEUE:-8}
GW=${GW:-$BIN/svc-gateway}
HAMMER_NICE=${HAMMER_NICE:-10}
HAMMER_ARGS=(--hammer-nice "$HAMMER_NICE")
[ -n "${HAMMER_CPUS:-}" ] && HAMMER_ARGS+=(--hammer-cpus "$HAMMER_CPUS")
[ -n "${HAMMER_H2:-}" ] && HAMMER_ARGS+=(--hammer-h2)
L="$BIN/svc-loadtest"
mkdir -p "$OUT"
W=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT

port_of() {
    for _ in $(seq 100); do
        local l
        l=$(grep -m1 '^listening on ' "$1" 2>/dev/null) && { echo "${l##*:}"; return 0; }
        sleep 0.1
    done
    echo "no address in $1" >&2
    cat "$1" >&2
    return 1
}

python3 "$S/measure_issuer.py" "$W" svc-gateway measure-user nobody > "$W/issuer.out" 2>&1 &
PIDS+=($!)
port_of "$W/issuer.out" > /dev/null || exit 1
"$L" webhook-server --listen 127.0.0.1:0 --cert "$W/issuer-server.pem" --key "$W/issuer-server.key" \
    > "$W/webhook.out" 2>&1 &
PIDS+=($!)
WPORT=$(port_of "$W/webhook.out") || exit 1
CA_B64=$(base64 -w0 "$W/issuer-ca.pem")
cat > "$W/authz-webhook.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: authz
  cluster:
    server: https://127.0.0.1:$WPORT/authorize
    certificate-authority-data: $CA_B64
users:
- name: gateway
  user: {}
contexts:
- name: authz
  context: {cluster: authz, user: gateway}
current-context: authz
EOF
cat > "$W/authz.yaml" <<EOF
apiVersion: apiserver.svc.io/v1beta1
kind: AuthorizationConfiguration
authorizers:
- type: Webhook
  name: allow-all
  webhook:
    timeout: 3s
    authorizedTTL: 5m
    unauthorizedTTL: 30s
    subjectAccessReviewVersion: v1
    matchConditionSubjectAccessReviewVersion: v1
    failurePolicy: Deny
    connectionInfo:
      type: SvcConfig
      svcConfigFile: $W/authz-webhook.kubeconfig
EOF

"$GW" --data-dir "$W/data" --bind-address 127.0.0.1 --secure-port 0 --log-level warn \
    --authorization-config "$W/authz.yaml" \
    --max-requests-inflight "$INFLIGHT" --max-queued-requests-per-user "$QUEUE" ${GW_ARGS:-} \
    > "$OUT/gateway.log" 2>&1 &
GPID=$!
PIDS+=("$GPID")
KC="$W/data/admin.kubeconfig"
for _ in $(seq 300); do
    [ -s "$KC" ] && kubectl --kubeconfig "$KC" -n default get serviceaccount default > /dev/null 2>&1 && break
    sleep 0.2
done

# user_kubeconfig NAME: a service account's token in a copy of the admin kubeconfig.
user_kubeconfig() {
    kubectl --kubeconfig "$KC" -n default create serviceaccount "$1" > /dev/null
    local token
    token=$(kubectl --kubeconfig "$KC" -n default create token "$1" --duration 24h)
    cp "$KC" "$W/$1.kubeconfig"
    kubectl --kubeconfig "$W/$1.kubeconfig" config set-credentials "$1" --token="$token" > /dev/null
    kubectl --kubeconfig "$W/$1.kubeconfig" config set-context --current --user="$1" > /dev/null
}
user_kubeconfig lt-hammer
user_kubeconfig lt-writer

echo "$(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/machine"
"$L" fairness --kubeconfig "$W/lt-hammer.kubeconfig" --writer-kubeconfig "$W/lt-writer.kubeconfig" \
    --objects "$OBJECTS" --clients "$CLIENTS" --rate "$RATE" --writers 2 --duration "$DUR" \
    --server-pid "$GPID" "${HAMMER_ARGS[@]}" --out "$OUT/fairness"
# The server's own account of both phases: request durations by verb, store and fsync times.
kubectl --kubeconfig "$KC" get --raw /metrics > "$OUT/metrics.txt" 2>/dev/null || true
