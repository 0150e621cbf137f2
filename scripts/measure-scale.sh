#!/usr/bin/env bash
# Measures fan-out at scale against raw-mux, the raw baseline multiplexed like h2 (BENCHMARKS.md,
# "Fan-out at scale against raw-mux"): release binaries, svc-gateway on 127.0.0.1:$PORT
# pinned to the server's CPUs, and one `svc-loadtest compare` per load, pinned to the load
# generator's CPUs, with the gateway over h2 and raw-mux (its server pinned to the server's
# CPUs too) on the same number of streams and connections (100 streams per connection).
# Reports (results.json, report.md, charts) go to OUT; the comparison tables are printed
# and kept in OUT/*.md.
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/measure-scale.sh [SERVER_CPUS GENERATOR_CPUS]   # taskset -c lists, e.g. 0-7 8-15
#        # OUT=/tmp/svc-scale DUR=10s PORT=18080 ONLY="10k-100 50k-20"; DIV=10 divides every
#        # load's watchers and connections by 10 (a smoke run on a small machine); FRAMES=1
#        # adds a gateway-h2-frames row: the same watches read by the load generator's
#        # frame-level h2 client (--h2-frames, one reader per connection) instead of hyper's
#        # RAW_FRAME_BYTES: the raw-mux-same-bytes row's frame size (default: the gateway's
#        # JSON watch event of the writers' object, measured at the start)
# Without CPU lists nothing is pinned.
set -u
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-scale}
DUR=${DUR:-10s}
ONLY=${ONLY:-}
DIV=${DIV:-1}
FRAMES=${FRAMES:-0}
PORT=${PORT:-18080}
SRV_CPUS=${1:-}
GEN_CPUS=${2:-}
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
URL="http://127.0.0.1:$PORT"
if curl -sf "$URL/readyz" > /dev/null; then
    echo "something already serves $URL: give another PORT" >&2
    exit 1
fi

SRV=()
GEN=()
[ -n "$SRV_CPUS" ] && SRV=(taskset -c "$SRV_CPUS")
[ -n "$GEN_CPUS" ] && GEN=(taskset -c "$GEN_CPUS")
RAW_CPUS=""
[ -n "$SRV_CPUS" ] && RAW_CPUS=", raw_cpus: \"$SRV_CPUS\""
echo "server CPUs: ${SRV_CPUS:-not pinned}; load generator CPUs: ${GEN_CPUS:-not pinned}"

"${SRV[@]}" "$BIN/svc-gateway" --data-dir "$W/gw" --bind-address 127.0.0.1 \
    --insecure-port "$PORT" --secure-port 0 --log-level warn --max-watches 2000000 \
    --watch-cache-max-watchers 2000000 \
    --http2-max-streams-per-connection 1000 > "$OUT/gateway.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    curl -sf "$URL/readyz" > /dev/null && break
    sleep 0.2
done
if ! kill -0 "${PIDS[0]}" 2>/dev/null || ! curl -sf "$URL/readyz" > /dev/null; then
    echo "svc-gateway did not start; see $OUT/gateway.log" >&2
    exit 1
fi

# The bytes of one watch event of the writers' 400-byte object as the gateway sends it (the
# object with the metadata the server sets, in the event's envelope): the raw-mux-same-bytes
# row's frames are this size, so that both sides move the same bytes. raw-mux's frames are
# the object's size, as the loads were first measured.
if [ -z "${RAW_FRAME_BYTES:-}" ]; then
    head='{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"event-size","namespace":"default","annotations":{"loadtest.svc/ts":"1700000000000000000","loadtest.svc/pad":"'
    tail='"}}}'
    pad=$((400 - ${#head} - ${#tail}))
    curl -sf -X POST -H 'Content-Type: application/json' -A svc-loadtest \
        --data "$head$(printf 'x%.0s' $(seq "$pad"))$tail" \
        "$URL/api/v1/namespaces/default/serviceaccounts" > /dev/null
    RAW_FRAME_BYTES=$(curl -sfN --max-time 5 "$URL/api/v1/namespaces/default/serviceaccounts?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Devent-size&timeoutSeconds=1" |
        head -1 | wc -c)
    curl -sf -X DELETE "$URL/api/v1/namespaces/default/serviceaccounts/event-size" > /dev/null
fi
[ "${RAW_FRAME_BYTES:-0}" -gt 16 ] || { echo "could not measure the gateway's event size" >&2; exit 1; }
echo "the gateway's watch event of a 400-byte object: $RAW_FRAME_BYTES bytes"

# One compare run: NAME WATCHERS CONNECTIONS RATE; gateway over h2 and raw-mux.
run() {
    local name=$1 watchers=$(($2 / DIV)) conns=$(($3 / DIV)) rate=$4
    if [ -n "$ONLY" ] && ! grep -qw -- "$name" <<< "$ONLY"; then return; fi
    [ "$conns" -ge 1 ] || conns=1
    {
        echo "scenario: fanout"
        echo "pause: 5s"
        echo "params:"
        echo "  watchers: $watchers"
        echo "  duration: $DUR"
        echo "  rate: $rate"
        echo "  writers: 10"
        echo "  object_size: 400"
        echo "  drain: 15s"
        echo "targets:"
        echo "  - {name: gateway-h2, server: \"$URL\", h2_connections: $conns}"
        [ "$FRAMES" = 1 ] &&
            echo "  - {name: gateway-h2-frames, server: \"$URL\", h2_connections: $conns, h2_frames: true}"
        echo "  - {name: raw-mux, raw: true, raw_connections: $conns$RAW_CPUS}"
        echo "  - {name: raw-mux-same-bytes, raw: true, raw_connections: $conns, raw_frame_bytes: $RAW_FRAME_BYTES$RAW_CPUS}"
    } > "$W/$name.yaml"
    echo "== $name: $watchers watchers over $conns connections x $rate writes/s (10 writers)"
    "${GEN[@]}" "$L" compare --scenario "$W/$name.yaml" --out "$OUT/$name" \
        > "$OUT/$name.md" 2> "$OUT/$name.err"
    cat "$OUT/$name.md"
}

run 10k-100 10000 100 100
run 20k-100 20000 200 100
run 50k-20 50000 500 20
run 50k-100 50000 500 100
# The 2-core ratio loads (server and load generator on one core each).
run 5k-100 5000 50 100
run 50k-10 50000 500 10
echo "reports in $OUT"
