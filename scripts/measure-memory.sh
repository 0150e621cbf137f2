#!/usr/bin/env bash
# Measures server memory per watch with `svc-loadtest hold`, each case against a fresh release
# gateway (plain HTTP on --insecure-port, or TLS with the admin client certificate):
#   h2     H2_STEPS total watches as h2 streams over H2_CONNS connections (default 10k, 100k,
#          1M over 1,000 connections, i.e. up to 1,000 streams per connection);
#   h1     H1_STEPS watches, one plain HTTP/1.1 connection each;
#   h1-tls the same over TLS (admin kubeconfig, client certificate).
# At each step the scenario reads the gateway's and its own RSS, then makes WRITES writes that
# every open stream must receive (per-stream counts). Ramping stops by itself when the
# machine's MemAvailable falls below MIN_AVAIL_MIB, and says so in the report.
#
# Limits: one file descriptor per connection on each side. HTTP/1.1 needs ulimit -n above
# the watch count in both processes (the script raises the soft limit to the hard one; this
# machine's hard limit is 20,000, so H1_STEPS stays at 10,000); beyond ~28,000 HTTP/1.1
# watches from one client address net.ipv4.ip_local_port_range must widen too. The h2 case
# needs only H2_CONNS descriptors. Kernel socket memory is not in any process's RSS: the
# scenario records /proc/net/sockstat's TCP pages beside it.
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/measure-memory.sh                 # all three cases
#        CASES="h2" H2_STEPS=10000,100000 scripts/measure-memory.sh
# env:   OUT=/tmp/svc-memory BIN=target/release CASES="h2 h1 h1-tls" H2_CONNS=1000
#        H2_STEPS=10000,100000,1000000 H1_STEPS=1000,10000 WRITES=3 RATE=2
#        MIN_AVAIL_MIB=3072 DRAIN=120s
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-memory}
CASES=${CASES:-h2 h1 h1-tls}
H2_CONNS=${H2_CONNS:-1000}
H2_STEPS=${H2_STEPS:-10000,100000,1000000}
H1_STEPS=${H1_STEPS:-1000,10000}
WRITES=${WRITES:-3}
RATE=${RATE:-2}
MIN_AVAIL_MIB=${MIN_AVAIL_MIB:-3072}
DRAIN=${DRAIN:-120s}
GW="$BIN/svc-gateway"
L="$BIN/svc-loadtest"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
mkdir -p "$OUT"
W=$(mktemp -d)
GPID=
cleanup() {
    [ -n "$GPID" ] && kill "$GPID" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT

# start_gateway NAME: a fresh gateway on its own data directory; sets GPID and PORT.
start_gateway() {
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$GW" --data-dir "$W/$1" --bind-address 127.0.0.1 --secure-port 0 --insecure-port "$PORT" \
        --log-level warn --max-watches 0 --watch-cache-max-watchers 2000000 \
        --http2-max-streams-per-connection 1000 \
        > "$OUT/gateway-$1.log" 2>&1 &
    GPID=$!
    for _ in $(seq 300); do
        curl -fs "http://127.0.0.1:$PORT/readyz" > /dev/null 2>&1 && [ -s "$W/$1/admin.kubeconfig" ] && return 0
        sleep 0.2
    done
    echo "gateway $1 did not become ready" >&2
    cat "$OUT/gateway-$1.log" >&2
    return 1
}

stop_gateway() {
    kill "$GPID" 2>/dev/null
    wait "$GPID" 2>/dev/null
    GPID=
}

echo "$(nproc) cores; $(free -g | awk '/Mem:/{print $2}') GiB; ulimit -n $(ulimit -n); load average $(cut -d' ' -f1-3 /proc/loadavg)" \
    | tee "$OUT/machine"
common=(--writes-per-step "$WRITES" --rate "$RATE" --drain "$DRAIN" --min-available-mib "$MIN_AVAIL_MIB")
for c in $CASES; do
    start_gateway "$c" || exit 1
    case $c in
        h2) target=(--server "http://127.0.0.1:$PORT" --h2-connections "$H2_CONNS" --steps "$H2_STEPS") ;;
        h1) target=(--server "http://127.0.0.1:$PORT" --steps "$H1_STEPS") ;;
        h1-tls) target=(--kubeconfig "$W/$c/admin.kubeconfig" --steps "$H1_STEPS") ;;
        *) echo "unknown case $c (h2, h1, h1-tls)" >&2; exit 1 ;;
    esac
    echo "== $c: ${target[*]}"
    "$L" hold "${target[@]}" "${common[@]}" --server-pid "$GPID" --out "$OUT/$c" > "$OUT/$c.stdout" \
        || echo "case $c failed (see $OUT/$c.stdout)"
    stop_gateway
done

python3 - "$OUT" $CASES <<'EOF'
import json, sys
out, cases = sys.argv[1], sys.argv[2:]
print()
print("| case | watches | server RSS MiB | server B/watch (step) | server B/watch (all, after writes) | client B/watch | kernel TCP MiB | streams complete | missed | deliver s | server µs/event |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
f = lambda v, d=0: "–" if v is None else f"{v:,.{d}f}"
for c in cases:
    try:
        r = json.load(open(f"{out}/{c}/results.json"))["runs"][0]
    except (OSError, ValueError, IndexError, KeyError):
        print(f"| {c} | no results | | | | | | | | | |")
        continue
    x = r["extra"]
    for s in x["steps"]:
        k = s["check"]
        print(f"| {c} | {s['open']:,} | {f((s['server_rss_bytes'] or 0) / 2**20)} | {f(s['server_bytes_per_watch'])} "
              f"| {f(s['server_bytes_per_watch_after_writes'])} | {f(s['client_bytes_per_watch'])} "
              f"| {f((s.get('tcp_mem_bytes') or 0) / 2**20)} | {k['complete']:,}/{s['open']:,} "
              f"| {k['missed_streams']} | {s['deliver_s']:.2f} | {f(s['server_cpu_us_per_event'], 2)} |")
    if x.get("server_bytes_per_connection") is not None:
        print(f"| {c} | per connection | | {f(x['server_bytes_per_connection'])} | | {f(x.get('client_bytes_per_connection'))} | | | | | |")
    if x.get("stopped"):
        print(f"\n{c}: {x['stopped']}\n")
EOF
