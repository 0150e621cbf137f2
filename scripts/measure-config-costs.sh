#!/usr/bin/env bash
# Measures what the configuration features cost, each against its baseline in one run on one
# machine (release binaries in BIN, default target/release; reports in OUT; ROUNDS rounds,
# baseline and feature alternating, default 3):
#   1. GET requests/s: a JWT user (--authentication-config, one issuer served by
#      scripts/measure_issuer.py, keys cached, groups mapped to system:masters) against the
#      admin client certificate;
#   2. GET requests/s: a service-account token user authorized by a Webhook authorizer
#      (--authorization-config, authorizedTTL 5m: a warm cache) against the admin certificate;
#   3. Event creates/s with one no-op mutating and one validating admission webhook against
#      none (the webhooks: `svc-loadtest webhook-server`);
#   4. fan-out (1,000 watchers, 100 writes/s) with audit at Metadata for everything (log file,
#      batch mode) against audit off.
# Every server runs on a fresh --data-dir on 127.0.0.1 (--secure-port 0); every process it
# starts is killed and its data removed at the end. Prints a Markdown table (also written
# to $OUT/summary.md).
# A feature whose flag this build does not have is reported as not measured.
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/measure-config-costs.sh
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-config-costs}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-10s}
GW="$BIN/svc-gateway"
L="$BIN/svc-loadtest"
GET_PATH=/api/v1/namespaces/default/serviceaccounts/default
mkdir -p "$OUT"
W=$(mktemp -d)
ulimit -n 20000 2>/dev/null || true
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    # the servers' data directories (a GiB or more after the fan-out runs); reports stay in OUT
    rm -rf "$W"
}
trap cleanup EXIT
log() { echo "== $*" >&2; }

# Waits until FILE has a line "listening on HOST:PORT"; prints PORT.
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

# start_gateway NAME ARGS...: a release gateway on a fresh data dir; sets GPID, KC (admin).
start_gateway() {
    local name=$1
    shift
    local d="$W/$name"
    mkdir -p "$d"
    "$GW" --data-dir "$d/data" --bind-address 127.0.0.1 --secure-port 0 --log-level warn "$@" \
        > "$OUT/$name.gateway.log" 2>&1 &
    GPID=$!
    PIDS+=("$GPID")
    KC="$d/data/admin.kubeconfig"
    for _ in $(seq 300); do
        if [ -s "$KC" ] && kubectl --kubeconfig "$KC" get --raw /readyz > /dev/null 2>&1; then
            # the default namespace's ServiceAccount exists once controllers have run
            kubectl --kubeconfig "$KC" -n default get serviceaccount default > /dev/null 2>&1 \
                && return 0
        fi
        kill -0 "$GPID" 2>/dev/null || break
        sleep 0.2
    done
    echo "gateway $name did not start:" >&2
    tail -20 "$OUT/$name.gateway.log" >&2
    return 1
}

stop_gateway() {
    kill "$GPID" 2>/dev/null
    wait "$GPID" 2>/dev/null
}

# token_kubeconfig ADMIN_KC TOKEN OUT_KC: the admin kubeconfig's cluster with a token user.
token_kubeconfig() {
    cp "$1" "$3"
    kubectl --kubeconfig "$3" config set-credentials measure-token --token="$2" > /dev/null
    kubectl --kubeconfig "$3" config set-context --current --user=measure-token > /dev/null
}

has_flag() { "$GW" --help 2>&1 | grep -q -- "$1"; }

# CPU seconds (user + system) a process has used so far.
cpu_s() {
    awk -v t="$(getconf CLK_TCK)" '{ print ($14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# run ROW PID SCENARIO ARGS...: one svc-loadtest run against the gateway PID, report in
# $OUT/ROW (results.json); $OUT/ROW.cpu: CPU seconds of the gateway and of the webhook server
# during the run.
run() {
    local row=$1 pid=$2
    shift 2
    log "$row: $*"
    local g0 w0
    g0=$(cpu_s "$pid")
    w0=$(cpu_s "$WPID")
    "$L" "$@" --out "$OUT/$row" > "$OUT/$row.md" 2> "$OUT/$row.err" \
        || { echo "svc-loadtest failed for $row:" >&2; tail -5 "$OUT/$row.err" >&2; }
    echo "$(cpu_s "$pid") $g0 $(cpu_s "$WPID") $w0" \
        | awk '{ printf "%.2f %.2f\n", $1 - $2, $3 - $4 }' > "$OUT/$row.cpu"
}

echo "$(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/machine"

# --- the issuer (also the CA and serving certificate of the webhook server) ---
python3 "$S/measure_issuer.py" "$W" svc-gateway measure-user system:masters > "$W/issuer.out" 2>&1 &
PIDS+=($!)
port_of "$W/issuer.out" > /dev/null || exit 1
ISSUER=$(cat "$W/issuer-url")
"$L" webhook-server --listen 127.0.0.1:0 --cert "$W/issuer-server.pem" --key "$W/issuer-server.key" \
    > "$W/webhook.out" 2>&1 &
WPID=$!
PIDS+=("$WPID")
WPORT=$(port_of "$W/webhook.out") || exit 1
CA_B64=$(base64 -w0 "$W/issuer-ca.pem")
webhook_stats() {
    curl -s --cacert "$W/issuer-ca.pem" "https://127.0.0.1:$WPORT/stats"
}

# --- 1. JWT against client certificate ---
cat > "$W/authn.yaml" <<EOF
apiVersion: apiserver.svc.io/v1beta1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: $ISSUER
    audiences: [svc-gateway]
    certificateAuthority: |
$(sed 's/^/      /' "$W/issuer-ca.pem")
  claimMappings:
    username:
      claim: sub
      prefix: "oidc:"
    groups:
      claim: groups
      prefix: ""
EOF
log "1. JWT authentication"
if start_gateway jwt --authentication-config "$W/authn.yaml"; then
    token_kubeconfig "$KC" "$(cat "$W/token.jwt")" "$W/jwt.kubeconfig"
    # the issuer's keys are fetched in the background: wait until the token is accepted
    for _ in $(seq 100); do
        kubectl --kubeconfig "$W/jwt.kubeconfig" get --raw "$GET_PATH" > /dev/null 2>&1 && break
        sleep 0.2
    done
    for r in $(seq "$ROUNDS"); do
        run "get-cert-jwtserver-r$r" "$GPID" get --kubeconfig "$KC" --path "$GET_PATH" --clients 32 --duration "$DUR"
        run "get-jwt-r$r" "$GPID" get --kubeconfig "$W/jwt.kubeconfig" --path "$GET_PATH" --clients 32 --duration "$DUR"
    done
    stop_gateway
fi

# --- 2. webhook authorizer (warm cache) against client certificate ---
if has_flag --authorization-config; then
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
  name: measure
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
    log "2. webhook authorization"
    if start_gateway authz --authorization-config "$W/authz.yaml"; then
        SA_TOKEN=$(kubectl --kubeconfig "$KC" -n default create token default --duration 24h)
        token_kubeconfig "$KC" "$SA_TOKEN" "$W/sa.kubeconfig"
        kubectl --kubeconfig "$W/sa.kubeconfig" get --raw "$GET_PATH" > /dev/null \
            || echo "the service account is not authorized through the webhook" >&2
        before=$(webhook_stats | jq .subjectAccessReviews)
        for r in $(seq "$ROUNDS"); do
            run "get-cert-authzserver-r$r" "$GPID" get --kubeconfig "$KC" --path "$GET_PATH" --clients 32 --duration "$DUR"
            run "get-sa-webhook-r$r" "$GPID" get --kubeconfig "$W/sa.kubeconfig" --path "$GET_PATH" --clients 32 --duration "$DUR"
        done
        after=$(webhook_stats | jq .subjectAccessReviews)
        echo "$((after - before))" > "$OUT/sar-calls-during-runs"
        stop_gateway
    fi
else
    log "2. skipped: this svc-gateway has no --authorization-config"
    echo "not measured: svc-gateway has no --authorization-config" > "$OUT/authz.skipped"
fi

# --- 3. admission webhooks against none ---
cat > "$W/webhooks.json" <<EOF
{"apiVersion": "v1", "kind": "List", "items": [
 {"apiVersion": "admissionregistration.svc.io/v1", "kind": "MutatingWebhookConfiguration",
  "metadata": {"name": "measure-mutating"},
  "webhooks": [{"name": "mutate.measure.svc.io",
    "clientConfig": {"url": "https://127.0.0.1:$WPORT/mutate", "caBundle": "$CA_B64"},
    "rules": [{"operations": ["CREATE"], "apiGroups": ["", "events.svc.io"], "apiVersions": ["v1"], "resources": ["events"]}],
    "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10, "admissionReviewVersions": ["v1"]}]},
 {"apiVersion": "admissionregistration.svc.io/v1", "kind": "ValidatingWebhookConfiguration",
  "metadata": {"name": "measure-validating"},
  "webhooks": [{"name": "validate.measure.svc.io",
    "clientConfig": {"url": "https://127.0.0.1:$WPORT/validate", "caBundle": "$CA_B64"},
    "rules": [{"operations": ["CREATE"], "apiGroups": ["", "events.svc.io"], "apiVersions": ["v1"], "resources": ["events"]}],
    "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10, "admissionReviewVersions": ["v1"]}]}
]}
EOF
log "3. admission webhooks"
if start_gateway events-none; then
    KC_NONE=$KC
    GPID_NONE=$GPID
    if start_gateway events-webhooks; then
        # the server validates the objects; kubectl's own check would need its OpenAPI
        kubectl --kubeconfig "$KC" create --validate=false -f "$W/webhooks.json" >&2 \
            || echo "creating the webhook configurations failed" >&2
        sleep 2
        before=$(webhook_stats | jq .admissionReviews)
        for r in $(seq "$ROUNDS"); do
            run "events-none-r$r" "$GPID_NONE" events --kubeconfig "$KC_NONE" --writers 64 --max --duration "$DUR" --server-pid "$GPID_NONE"
            run "events-webhooks-r$r" "$GPID" events --kubeconfig "$KC" --writers 64 --max --duration "$DUR" --server-pid "$GPID"
        done
        after=$(webhook_stats | jq .admissionReviews)
        echo "$((after - before))" > "$OUT/admission-calls-during-runs"
        stop_gateway
    fi
    GPID=$GPID_NONE
    stop_gateway
fi

# --- 4. audit at Metadata against no audit, fan-out ---
if has_flag --audit-policy-file; then
    cat > "$W/audit-policy.yaml" <<EOF
apiVersion: audit.svc.io/v1
kind: Policy
rules:
- level: Metadata
EOF
    log "4. audit"
    if start_gateway fanout-none; then
        KC_NONE=$KC
        GPID_NONE=$GPID
        if start_gateway fanout-audit --audit-policy-file "$W/audit-policy.yaml" \
            --audit-log-path "$W/audit.log" --audit-log-mode batch; then
            for r in $(seq "$ROUNDS"); do
                run "fanout-none-r$r" "$GPID_NONE" fanout --kubeconfig "$KC_NONE" --watchers 1000 --rate 100 --duration "$DUR" --server-pid "$GPID_NONE"
                run "fanout-audit-r$r" "$GPID" fanout --kubeconfig "$KC" --watchers 1000 --rate 100 --duration "$DUR" --server-pid "$GPID"
            done
            wc -l < "$W/audit.log" > "$OUT/audit-log-lines"
            stop_gateway
        fi
        GPID=$GPID_NONE
        stop_gateway
    fi
else
    log "4. skipped: this svc-gateway has no --audit-policy-file"
    echo "not measured: svc-gateway has no --audit-policy-file" > "$OUT/audit.skipped"
fi

# --- the table ---
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine"
python3 - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/summary.md"
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def load(row):
    p = os.path.join(out, row, "results.json")
    if not os.path.exists(p):
        return None
    return json.load(open(p))["runs"][0]

def cpu(row):
    """CPU seconds of (gateway, webhook server) during the run."""
    p = os.path.join(out, row + ".cpu")
    if not os.path.exists(p):
        return (0.0, 0.0)
    g, w = open(p).read().split()
    return (float(g), float(w))

def figures(kind, row, r):
    """(rate, p99 ms, failures, gateway CPU-us per op, webhook server CPU s) of one run."""
    c = r["counts"]
    if kind == "get":
        f = (r["extra"]["requests_per_s"], r["latency_ms"]["p99"], c["watch_errors"])
    elif kind == "events":
        f = (c["writes_per_s"], r["write_latency_ms"]["p99"], c["write_errors"])
    else:
        f = (c["events_per_s"], r["latency_ms"]["p99"],
             c["write_errors"] + c["watch_errors"] + c["missing"])
    g, w = cpu(row)
    ops = f[0] * r["elapsed_s"]
    return f + ((g * 1e6 / ops) if ops else 0.0, w)

pairs = [
    ("get", "GET requests/s, client certificate (admin)", "get-cert-jwtserver",
     "GET requests/s, JWT (one issuer, keys cached)", "get-jwt"),
    ("get", "GET requests/s, client certificate (admin)", "get-cert-authzserver",
     "GET requests/s, service-account token, Webhook authorizer (warm cache)", "get-sa-webhook"),
    ("events", "Event creates/s, no admission webhooks", "events-none",
     "Event creates/s, 1 mutating + 1 validating webhook", "events-webhooks"),
    ("fanout", "fan-out events/s (1,000 watchers x 100 writes/s), audit off", "fanout-none",
     "fan-out events/s, audit Metadata (log, batch)", "fanout-audit"),
]
print("| what | rate per round | mean | ratio | p99 ms (per round) | failures | "
      "gateway CPU-us per op (ratio) | webhook server CPU s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for kind, bname, brow, fname, frow in pairs:
    means, cpus = {}, {}
    for name, row in ((bname, brow), (fname, frow)):
        rows = [f"{row}-r{i}" for i in range(1, rounds + 1)]
        runs = [(x, load(x)) for x in rows]
        runs = [(x, r) for x, r in runs if r is not None]
        if not runs:
            print(f"| {name} | not measured | | | | | | |")
            continue
        f = [figures(kind, x, r) for x, r in runs]
        mean = statistics.mean(x[0] for x in f)
        cpu_mean = statistics.mean(x[3] for x in f)
        means[row], cpus[row] = mean, cpu_mean
        ratio, cpu_ratio = "", ""
        if row == frow and means.get(brow):
            ratio = f"**{mean / means[brow]:.2f}x**"
        if row == frow and cpus.get(brow):
            cpu_ratio = f" ({cpu_mean / cpus[brow]:.2f}x)"
        print(f"| {name} | {' / '.join(f'{x[0]:,.0f}' for x in f)} | {mean:,.0f} | {ratio} | "
              f"{' / '.join(f'{x[1]:.2f}' for x in f)} | {sum(x[2] for x in f)} | "
              f"{cpu_mean:.1f}{cpu_ratio} | {' / '.join(f'{x[4]:.1f}' for x in f)} |")
for f, what in (("sar-calls-during-runs", "SubjectAccessReviews the webhook answered during the runs"),
                ("admission-calls-during-runs", "AdmissionReviews the webhook answered during the runs"),
                ("audit-log-lines", "audit log lines written (audited server)"),
                ("authz.skipped", "webhook authorizer"), ("audit.skipped", "audit"),
                ("machine", "machine")):
    p = os.path.join(out, f)
    if os.path.exists(p):
        print(f"\n{what}: {open(p).read().strip()}")
EOF
