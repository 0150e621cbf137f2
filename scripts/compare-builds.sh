#!/usr/bin/env bash
# Two builds of the gateway side by side in one `svc-loadtest compare` run per load, each
# target repeated in turn, the pair's order switched every round (A, B, B, A, A, B, ...) so
# that neither build always runs right after the other, and the run-to-run spread is visible
# beside the difference. For a refactor: same results within that spread, or a measured
# change. On a 2-core machine a fan-out p99 spreads by half its value from run to run: a
# difference of a third needs about 8 rounds (ROUNDS=8) before its medians tell it apart.
#
# usage: scripts/compare-builds.sh A_BIN_DIR B_BIN_DIR      # dirs holding svc-gateway
#        OUT=/tmp/svc-builds DUR=10s ROUNDS=2 scripts/compare-builds.sh ...
# Loads: 10k h2 watchers (100 connections) x 50 writes/s; 1k HTTP/1.1 watchers x 100
# writes/s; 4 clients listing 2,000 objects; 8 writers churning. The load generator is B's
# svc-loadtest; everything stays on 127.0.0.1.
set -u
A=${1:?usage: compare-builds.sh A_BIN_DIR B_BIN_DIR}
B=${2:?usage: compare-builds.sh A_BIN_DIR B_BIN_DIR}
OUT=${OUT:-/tmp/svc-builds}
DUR=${DUR:-10s}
ROUNDS=${ROUNDS:-2}
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

start() { # NAME BIN_DIR PORT
    "$2/svc-gateway" --data-dir "$W/$1" --bind-address 127.0.0.1 --insecure-port "$3" \
        --secure-port $(($3 + 363)) --log-level warn --max-watches 2000000 \
        --http2-max-streams-per-connection 1000 > "$OUT/$1.log" 2>&1 &
    PIDS+=($!)
}
start a "$A" 18080
start b "$B" 19080
for _ in $(seq 100); do
    curl -sf http://127.0.0.1:18080/readyz > /dev/null &&
        curl -sf http://127.0.0.1:19080/readyz > /dev/null && break
    sleep 0.2
done

run() { # NAME SCENARIO EXTRA-TARGET-FIELDS PARAM-LINES...
    local name=$1 scenario=$2 extra=$3
    shift 3
    {
        echo "scenario: $scenario"
        echo "params:"
        echo "  duration: $DUR"
        for p in "$@"; do echo "  $p"; done
        echo "targets:"
        for r in $(seq "$ROUNDS"); do
            local pair=(a b)
            ((r % 2 == 0)) && pair=(b a)
            for t in "${pair[@]}"; do
                local port=18080
                [[ $t == b ]] && port=19080
                echo "  - {name: $t, server: \"http://127.0.0.1:$port\"$extra}"
            done
        done
    } > "$W/$name.yaml"
    echo "== $name"
    "$B/svc-loadtest" compare --scenario "$W/$name.yaml" --out "$OUT/$name" \
        > "$OUT/$name.md" 2> "$OUT/$name.err"
    grep -E '^\| (target|a|b) ' "$OUT/$name.md"
}

run h2-10k fanout ", h2_connections: 100" "watchers: 10000" "rate: 50" "writers: 10" \
    "object_size: 400" "drain: 15s"
run h1-1k fanout "" "watchers: 1000" "rate: 100" "writers: 10" "object_size: 400" "drain: 15s"
run list-2k list "" "objects: 2000" "clients: 4"
run churn churn "" "writers: 8" "rate: 0"
