#!/usr/bin/env bash
# The side-by-side benchmark against a real kube-apiserver (BENCHMARKS.md, "Against
# kube-apiserver"). Starts, on 127.0.0.1 only:
#   kube-apiserver   etcd + kube-apiserver from interop/kube.sh (watch cache on; its default
#                    flags otherwise: priority and fairness back on, which kube.sh turns off)
#   gateway          svc-gateway on its embedded store (interop/gateway.sh)
#   gateway-etcd     svc-gateway on the same etcd as kube-apiserver, under its own prefix
# then runs one `svc-loadtest compare` per load (loadtest/scenarios/against-kube/*.yaml), so
# every table row of a load comes from the same run, and writes the reports and a summary
# (summary.md: the tables, the ratios against kube-apiserver and the targets' hit/miss).
# Server CPU and RSS are read from /proc for the process listening on each target's port
# (kube-apiserver, the gateway); etcd's CPU is sampled apart (--store-pid) and reported as
# store CPU. Everything is stopped at the end, and by a watchdog after MAX_S seconds.
#
# usage: scripts/against-kube.sh                         # the full run (~25 min)
#        SMOKE=1 scripts/against-kube.sh                 # every load scaled down (~10 min)
#        ONLY='fanout-1k-h2-json list-10k-rv0-json' scripts/against-kube.sh
# Environment: BIN (dir with release svc-gateway and svc-loadtest; default
# $CARGO_TARGET_DIR/release), OUT (default /tmp/against-kube), QUIET_WAIT_S (default 900:
# how long to wait for compilers on the machine to finish before the full run), MAX_S.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release}
OUT=${OUT:-/tmp/against-kube}
SCEN=$REPO/loadtest/scenarios/against-kube
SMOKE=${SMOKE:-}
MAX_S=${MAX_S:-3300}
QUIET_WAIT_S=${QUIET_WAIT_S:-900}
L=$BIN/svc-loadtest
for b in "$L" "$BIN/svc-gateway"; do
	[[ -x $b ]] || {
		echo "missing $b: cargo build --release -p svc-gateway -p svc-loadtest" >&2
		exit 2
	}
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN=$OUT/servers
rm -rf "$RUN" "$OUT/scenarios"
mkdir -p "$RUN" "$OUT/scenarios"
ulimit -n 20000 2>/dev/null || true
log() { echo "against-kube: $*" >&2; }

cleanup() {
	trap - EXIT INT TERM
	[[ -n ${WATCHDOG:-} ]] && kill "$WATCHDOG" 2>/dev/null
	stop_servers
}
trap cleanup EXIT
CUR=
trap 'log "interrupted"; [[ -n $CUR ]] && kill -TERM "$CUR" 2>/dev/null; exit 130' INT TERM
(sleep "$MAX_S" && log "watchdog: over ${MAX_S}s, stopping" && kill -TERM $$) &
WATCHDOG=$!

busy() { pgrep -x rustc || pgrep -f 'cargo (build|test|clippy|check|bench)' || pgrep -x compile ||
	pgrep -f 'go (build|test|install)'; }
machine() {
	echo "## $1: $(date -u +%FT%TZ)"
	echo "uptime: $(uptime)"
	echo "compilers running: $(busy | wc -l)"
}
{
	echo "# against-kube run"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
	echo "kube-apiserver: $("$REPO/interop/kube.sh" paths | head -1)"
	echo "gateway: $BIN/svc-gateway ($(git -C "$REPO" rev-parse --short HEAD))"
	echo "smoke: ${SMOKE:-no}"
} >"$OUT/machine.md"
if [[ -z $SMOKE ]]; then
	waited=0
	while busy >/dev/null && ((waited < QUIET_WAIT_S)); do
		((waited == 0)) && log "waiting (up to ${QUIET_WAIT_S}s) for compilers to finish"
		sleep 10
		waited=$((waited + 10))
	done
	echo "waited ${waited}s for a quiet machine" >>"$OUT/machine.md"
fi
machine before >>"$OUT/machine.md"

# --- servers ---
stop_servers() {
	"$REPO/interop/gateway.sh" stop "$RUN/gateway-etcd" || true
	"$REPO/interop/gateway.sh" stop "$RUN/gateway" || true
	"$REPO/interop/kube.sh" stop "$RUN/kube" || true
}
start_servers() {
	log "starting etcd + kube-apiserver"
	KUBE_APISERVER_EXTRA_FLAGS="--enable-priority-and-fairness=true ${KUBE_APISERVER_EXTRA_FLAGS:-}" \
		timeout 300 "$REPO/interop/kube.sh" start "$RUN/kube" || return 1
	ETCD_URL=$(cat "$RUN/kube/etcd.url")
	ETCD_PID=$(cat "$RUN/kube/etcd.pid")
	log "starting the gateway (embedded store)"
	SVC_GATEWAY_BIN=$BIN/svc-gateway SVC_GATEWAY_EXTRA_FLAGS="--log-level warn" \
		timeout 120 "$REPO/interop/gateway.sh" start "$RUN/gateway" || return 1
	log "starting the gateway on kube-apiserver's etcd ($ETCD_URL, prefix /svc-gateway-bench)"
	SVC_GATEWAY_BIN=$BIN/svc-gateway SVC_GATEWAY_EXTRA_FLAGS="--log-level warn --storage-backend=etcd \
--etcd-servers=$ETCD_URL --etcd-prefix=/svc-gateway-bench" \
		timeout 120 "$REPO/interop/gateway.sh" start "$RUN/gateway-etcd" || return 1
	{
		echo "kube-apiserver pid $(cat "$RUN/kube/kube-apiserver.pid"), etcd pid $ETCD_PID ($ETCD_URL)"
		echo "gateway pid $(cat "$RUN/gateway/gateway.pid"), gateway-etcd pid $(cat "$RUN/gateway-etcd/gateway.pid")"
	} >>"$OUT/machine.md"
}
start_servers || exit 1

# --- loads ---
render() { # NAME: the scenario with this run's kubeconfigs and etcd pid (smaller with SMOKE)
	local smoke=()
	if [[ -n $SMOKE ]]; then
		smoke=(-e 's/^(  watchers:) 10000$/\1 500/' -e 's/^(  watchers:) 1000$/\1 200/'
			-e 's/^(  watchers:) 2000$/\1 200/' -e 's/^(  h2_connections:) 100$/\1 5/'
			-e 's/^(  h2_connections:) 10$/\1 2/' -e 's/^(  h2_connections:) 1000$/\1 20/'
			-e 's/^(  steps:) .*/\1 "500,2000"/' -e 's/^(  objects:) 10000$/\1 1000/'
			-e 's/^(  objects:) 1000$/\1 200/' -e 's/^(  duration:) .*/\1 3s/'
			-e 's/^(  drain:) .*/\1 5s/' -e 's/^(  settle:) .*/\1 1s/')
	fi
	sed -E -e "s|@KUBE_KUBECONFIG@|$RUN/kube/admin.kubeconfig|" \
		-e "s|@GATEWAY_KUBECONFIG@|$RUN/gateway/admin.kubeconfig|" \
		-e "s|@GATEWAY_ETCD_KUBECONFIG@|$RUN/gateway-etcd/admin.kubeconfig|" \
		-e "s|@ETCD_PID@|$ETCD_PID|" "${smoke[@]}" "$SCEN/$1.yaml" >"$OUT/scenarios/$1.yaml"
}

LOADS=(
	fanout-1k-h1-json fanout-1k-h1-protobuf fanout-1k-h2-json fanout-1k-h2-protobuf
	fanout-10k-h2-protobuf fanout-10k-h2-json fanout-10k-h1-protobuf fanout-10k-h1-json
	list-10k-rv0-json list-10k-rvunset-json list-10k-paged-json
	list-10k-rv0-protobuf list-10k-rvunset-protobuf list-10k-paged-protobuf
	relist-storm-2k hold-100k
)
limit() { # NAME: seconds a compare of this load may take (all three targets)
	case $1 in
	fanout-1k*) echo 240 ;; fanout-10k*) echo 420 ;; list*) echo 360 ;;
	relist*) echo 720 ;; hold*) echo 1200 ;; *) echo 600 ;;
	esac
}
for name in "${LOADS[@]}"; do
	if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]]; then continue; fi
	if [[ $name == hold* ]]; then
		# Memory per watch is read from RSS: fresh server processes, so that memory an
		# allocator kept from the loads before is not handed out again unseen.
		log "restarting the servers for $name"
		stop_servers
		start_servers || exit 1
	fi
	render "$name"
	log "== $name ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
	t0=$SECONDS
	# In the background and waited for, so that a signal (the watchdog's) is handled at once.
	timeout --kill-after=20 "$(limit "$name")" "$L" compare --scenario "$OUT/scenarios/$name.yaml" \
		--out "$OUT/$name" >"$OUT/$name.md" 2>"$OUT/$name.err" &
	CUR=$!
	wait "$CUR"
	rc=$?
	CUR=
	echo "| $name | $((SECONDS - t0)) s | exit $rc |" >>"$OUT/timings.md"
	((rc == 0)) || log "$name: exit $rc (see $OUT/$name.err)"
done

machine after >>"$OUT/machine.md"
python3 "$REPO/scripts/against-kube-summary.py" "$OUT" >"$OUT/summary.md" ||
	log "summary failed"
log "reports in $OUT; summary in $OUT/summary.md"
