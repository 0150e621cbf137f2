#!/usr/bin/env bash
# Where a fan-out delivery's time goes: one load of scripts/measure-scale.sh (the gateway over
# h2 against raw-mux, same streams and connections), with the gateway's process under
# `perf stat` (CPU, context switches, the socket and wait syscalls) for its part of the run,
# then the raw-mux server's under the same counters for its part, and the gateway's samples
# (`perf record -g`) for 20 s of its part. Per delivered event: divide by the events of the
# report (the gateway's own count is in OUT/gateway-metrics.txt).
#
# usage: cargo build --release -p svc-gateway -p svc-loadtest
#        scripts/profile-fanout.sh 5k-100            # a load name of measure-scale.sh
#        BIN=/tmp/build OUT=/tmp/svc-profile scripts/profile-fanout.sh 50k-10
# Needs perf (linux-perf) and root or kernel.perf_event_paranoid <= 1; 127.0.0.1 only.
set -u
LOAD=${1:?usage: profile-fanout.sh LOAD (a measure-scale.sh load name, e.g. 5k-100)}
S=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$S/../target/release}
OUT=${OUT:-/tmp/svc-profile}/$LOAD
PORT=${PORT:-18080}
command -v perf > /dev/null || { echo "profile-fanout.sh: needs perf" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
EV=task-clock,context-switches,cpu-migrations
for s in sendto sendmsg write writev recvfrom read epoll_wait futex; do
    EV=$EV,syscalls:sys_enter_$s
done
BIN=$BIN OUT=$OUT ONLY=$LOAD PORT=$PORT "$S/measure-scale.sh" > "$OUT/run.log" 2>&1 &
RUN=$!
GW=
for _ in $(seq 200); do
    GW=$(pgrep -f "svc-gateway --data-dir .*--insecure-port $PORT" | head -1)
    [ -n "$GW" ] && break
    sleep 0.1
done
[ -n "$GW" ] || { echo "profile-fanout.sh: the gateway did not start; see $OUT/run.log" >&2; exit 1; }
perf stat -e "$EV" -p "$GW" -o "$OUT/gateway.stat" &
STAT=$!
# Samples from the middle of the gateway's part (its watchers connect first).
(sleep 6 && perf record -F 499 -g -p "$GW" -o "$OUT/perf.data" -- sleep 20 > "$OUT/perf.log" 2>&1) &
REC=$!
RAW=
for _ in $(seq 1200); do
    RAW=$(pgrep -f raw-server | head -1)
    [ -n "$RAW" ] && break
    sleep 0.1
done
kill -INT "$STAT" 2>/dev/null
wait "$STAT"
curl -s "http://127.0.0.1:$PORT/metrics" |
    grep -E '^(svc_http2_writes_total|svc_http2_short_writes_total|apiserver_watch_events_total)' > "$OUT/gateway-metrics.txt"
if [ -n "$RAW" ]; then
    perf stat -e "$EV" -p "$RAW" -o "$OUT/raw.stat" &
    STAT=$!
fi
wait "$RUN"
[ -n "$RAW" ] && { kill -INT "$STAT" 2>/dev/null; wait "$STAT"; }
wait "$REC"
perf report -i "$OUT/perf.data" --no-children --sort symbol --stdio -g none 2> /dev/null |
    grep -E '^ +[0-9]' > "$OUT/flat.txt"
cat "$OUT/$LOAD.md"
grep -hE 'task-clock|context-switches|sys_enter_(sendto|writev|epoll_wait|futex)' \
    "$OUT/gateway.stat" "$OUT/raw.stat" 2> /dev/null
cat "$OUT/gateway-metrics.txt"
echo "profile: $OUT/flat.txt (perf report -i $OUT/perf.data for the call graphs)"
