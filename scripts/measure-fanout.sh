#!/usr/bin/env bash
# Measures the fan-out targets of BENCHMARKS.md ("Fan-out against its baselines") in one
# sitting: release binaries, svc-gateway on 127.0.0.1 (plain :18080 and TLS :18443), etcd
# on :23791, and `svc-loadtest compare` for each load, so every gateway figure has its
# baseline from the same run. Reports (results.json, report.md, charts) go to OUT; the
# comparison tables are printed and kept in OUT/*.md.
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/measure-fanout.sh        # OUT=/tmp/svc-fanout DUR=10s ONLY="h1-1k h2-10k"
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-fanout}
DUR=${DUR:-10s}
ONLY=${ONLY:-}
L="$BIN/svc-loadtest"
mkdir -p "$OUT"
ulimit -n 65536 2>/dev/null || ulimit -n 20000 2>/dev/null || true
W=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT

"$BIN/svc-gateway" --data-dir "$W/gw" --bind-address 127.0.0.1 --insecure-port 18080 \
    --secure-port 18443 --log-level warn --max-watches 2000000 \
    --http2-max-streams-per-connection 1000 > "$OUT/gateway.log" 2>&1 &
PIDS+=($!)
etcd --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:23791 \
    --advertise-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 \
    --initial-advertise-peer-urls http://127.0.0.1:23801 \
    --initial-cluster default=http://127.0.0.1:23801 > "$OUT/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    [ -f "$W/gw/admin.kubeconfig" ] && curl -sf http://127.0.0.1:18080/readyz > /dev/null && break
    sleep 0.2
done
KC="$W/gw/admin.kubeconfig"

# One compare run: NAME WATCHERS RATE WRITERS TARGET-LINES...
run() {
    local name=$1 watchers=$2 rate=$3 writers=$4
    shift 4
    if [ -n "$ONLY" ] && ! grep -qw "$name" <<< "$ONLY"; then return; fi
    {
        echo "scenario: fanout"
        echo "params:"
        echo "  watchers: $watchers"
        echo "  duration: $DUR"
        echo "  rate: $rate"
        echo "  writers: $writers"
        echo "  object_size: 400"
        echo "  drain: 15s"
        echo "targets:"
        for t in "$@"; do echo "  - $t"; done
    } > "$W/$name.yaml"
    echo "== $name: $watchers watchers x $rate writes/s ($writers writers)"
    "$L" compare --scenario "$W/$name.yaml" --out "$OUT/$name" > "$OUT/$name.md" 2> "$OUT/$name.err"
    cat "$OUT/$name.md"
}

GW1='{name: gateway-h1, server: "http://127.0.0.1:18080"}'
GW2='{name: gateway-h2, server: "http://127.0.0.1:18080", h2_connections: 100}'
GW2TLS="{name: gateway-h2-tls, kubeconfig: \"$KC\", h2_connections: 100}"
RAW='{name: raw, raw: true}'
ETCD='{name: etcd, etcd_endpoints: "http://127.0.0.1:23791", etcd_connections: 4, etcd_watches_per_stream: 100}'

# The writer alone, then beside 1k and 10k watchers (writes never starve).
run writer-0 1 100 10 "$GW1"
run writer-1k 1000 100 10 "$GW1"
run writer-10k 10000 100 10 "$GW1"
# HTTP/1.1 against raw where both fit on the machine.
run h1-1k 1000 100 10 "$GW1" "$RAW"
run h1-9k 9000 50 10 "$GW1" "$RAW"
# h2, plain and TLS.
run h2-10k 10000 50 10 "$GW2" "$GW2TLS"
# 1 million events/s offered: every target.
run baselines-10k 10000 100 10 "$GW2" "$GW1" "$ETCD" "$RAW"
if [ -z "$ONLY" ] || grep -qw slow <<< "$ONLY"; then
    echo "== slow: 10 stalled among 1,000 watchers, 100 writes/s"
    "$L" slow-watcher --server http://127.0.0.1:18080 --watchers 1000 --stalled 10 \
        --rate 100 --writers 10 --duration 20s --out "$OUT/slow" > "$OUT/slow.md" 2> "$OUT/slow.err"
    cat "$OUT/slow.md"
fi
echo "reports in $OUT"
