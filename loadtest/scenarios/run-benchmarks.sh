#!/usr/bin/env bash
# Runs the benchmarks recorded in BENCHMARKS.md: release binaries (BIN, default
# target/release), svc-gateway on 127.0.0.1:18080 and etcd on 127.0.0.1:23791, reports in OUT.
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../../target/release}
OUT=${OUT:-/tmp/svc-loadtest-out}
mkdir -p "$OUT"; cd "$OUT"
ulimit -n 20000 2>/dev/null || true
G=$(mktemp -d); E=$(mktemp -d)
timeout 900 "$BIN/svc-gateway" --data-dir "$G" --insecure-port 18080 --secure-port 0 --log-level warn > gw.log 2>&1 &
GP=$!
timeout 900 etcd --data-dir "$E/d" --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 --initial-advertise-peer-urls http://127.0.0.1:23801 --initial-cluster default=http://127.0.0.1:23801 > etcd.log 2>&1 &
EP=$!
sleep 3
SP=$(pgrep -P "$GP" || echo "$GP") # the server itself, not timeout(1), for --server-pid
L="$BIN/svc-loadtest"
"$L" compare --scenario "$S/fanout-10k.yaml" --out "$OUT/fanout-10k" > fanout.md 2> fanout.err
"$L" compare --scenario "$S/baselines-10k.yaml" --out "$OUT/baselines-10k" > baselines.md 2> baselines.err
"$L" fanout --server http://127.0.0.1:18080 --watchers 10000 --rate 100 --writers 2 --duration 10s --server-pid "$SP" --out "$OUT/fanout-10k-100" > f100.md 2> f100.err
"$L" slow-watcher --server http://127.0.0.1:18080 --watchers 1000 --stalled 10 --max --writers 4 --duration 10s --server-pid "$SP" --out "$OUT/slow" > slow.md 2> slow.err
"$L" compare --scenario "$S/churn-64.yaml" --out "$OUT/churn" > churn.md 2> churn.err
"$L" events --server http://127.0.0.1:18080 --writers 64 --max --duration 20s --server-pid "$SP" --out "$OUT/events-64" > events.md 2> events.err
kill "$GP" "$EP"
echo "reports in $OUT"
