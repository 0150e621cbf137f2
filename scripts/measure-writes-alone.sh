#!/usr/bin/env bash
# The writers' acknowledgement latency without a fan-out: the baseline of issue 38's "writes
# first" target (under a fan-out the ack p99 may not grow past 2× this). One fresh release
# gateway, one watcher (frame-level h2 client), 10 writers of 400-byte objects at 100 and at 10
# writes/s (the writes of measure-scale.sh's 5k-100 and 50k-10), with raw-mux beside it on the
# same terms. Prints one line per rate and target: ack p50 and p99 in ms.
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/measure-writes-alone.sh
# env:   BIN=target/release OUT=/tmp/svc-writes-alone PORT=18182; DUR=10s at 100 writes/s and
#        DUR10=30s at 10 (300 writes, so that the p99 is not one slow write's); 127.0.0.1 only.
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-writes-alone}
PORT=${PORT:-18182}
DUR=${DUR:-10s}
DUR10=${DUR10:-30s}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"
W=$(mktemp -d)
GW=
cleanup() {
    [ -n "$GW" ] && kill "$GW" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
if curl -sf "$URL/readyz" > /dev/null; then
    echo "something already serves $URL: give another PORT" >&2
    exit 1
fi
"$BIN/svc-gateway" --data-dir "$W/gw" --bind-address 127.0.0.1 --insecure-port "$PORT" \
    --secure-port 0 --log-level warn > "$OUT/gateway.log" 2>&1 &
GW=$!
for _ in $(seq 100); do
    curl -sf "$URL/readyz" > /dev/null && break
    sleep 0.2
done
curl -sf "$URL/readyz" > /dev/null || {
    echo "svc-gateway did not start; see $OUT/gateway.log" >&2
    exit 1
}
for rate in 100 10; do
    dur=$DUR
    [ "$rate" = 10 ] && dur=$DUR10
    cat > "$W/s$rate.yaml" << EOF
scenario: fanout
pause: 5s
params:
  watchers: 1
  duration: $dur
  rate: $rate
  writers: 10
  object_size: 400
  drain: 15s
targets:
  - {name: gateway-h2-frames, server: "$URL", h2_connections: 1, h2_frames: true}
  - {name: raw-mux, raw: true, raw_connections: 1}
EOF
    "$BIN/svc-loadtest" compare --scenario "$W/s$rate.yaml" --out "$OUT/$rate" \
        > "$OUT/$rate.md" 2> "$OUT/$rate.err" || {
        echo "svc-loadtest failed; see $OUT/$rate.err" >&2
        exit 1
    }
    python3 - "$OUT/$rate/results.json" "$rate" << 'EOP'
import json, sys
for run in json.load(open(sys.argv[1]))["runs"]:
    w = run["write_latency_ms"]
    print(f"{sys.argv[2]} writes/s  {run['target']['name']:<18} ack p50 {w['p50']:.2f} ms  p99 {w['p99']:.2f} ms")
EOP
done
