#!/usr/bin/env bash
# The proxy-mode benchmark (BENCHMARKS.md, "Through the proxy"): the same loads against
# kube-apiserver directly and through svc-gateway in proxy mode in front of it. Starts, on
# 127.0.0.1 only:
#   kube-apiserver   etcd + kube-apiserver from interop/kube.sh (watch cache on; priority and
#                    fairness on, as in a cluster)
#   proxy            svc-gateway --upstream-kubeconfig in front of it (interop/gateway.sh
#                    start-proxy), reached with the admin's credential
# then runs one `svc-loadtest compare` per load (loadtest/scenarios/through-proxy/*.yaml).
# Through the proxy, writes pass through to kube-apiserver and lists and watches come from
# the proxy's cache. Server CPU is the process listening on the target's port (kube-apiserver,
# the proxy); the "store" CPU sampled beside it is etcd's for kube-apiserver and
# kube-apiserver's for the proxy (the upstream's cost of what the proxy serves).
#
# usage: scripts/through-proxy.sh                  # every load (~12 min)
#        SMOKE=1 scripts/through-proxy.sh          # scaled down (~4 min)
#        ONLY='fanout-1k-h2-json' scripts/through-proxy.sh
# Environment: BIN (dir with release svc-gateway and svc-loadtest; default
# $CARGO_TARGET_DIR/release), OUT (default /tmp/through-proxy), MAX_S.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release}
OUT=${OUT:-/tmp/through-proxy}
SCEN=$REPO/loadtest/scenarios/through-proxy
SMOKE=${SMOKE:-}
MAX_S=${MAX_S:-1500}
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
log() { echo "through-proxy: $*" >&2; }

stop_servers() {
	"$REPO/interop/gateway.sh" stop "$RUN/proxy" || true
	"$REPO/interop/kube.sh" stop "$RUN/kube" || true
}
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

{
	echo "# through-proxy run"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
	echo "kube-apiserver: $("$REPO/interop/kube.sh" paths | head -1)"
	echo "proxy: $BIN/svc-gateway ($(git -C "$REPO" rev-parse --short HEAD))"
	echo "smoke: ${SMOKE:-no}; start: $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.md"

log "starting etcd + kube-apiserver"
KUBE_APISERVER_EXTRA_FLAGS="--enable-priority-and-fairness=true ${KUBE_APISERVER_EXTRA_FLAGS:-}" \
	timeout 300 "$REPO/interop/kube.sh" start "$RUN/kube" || exit 1
log "starting the proxy"
SVC_GATEWAY_BIN=$BIN/svc-gateway SVC_PROXY_EXTRA_FLAGS="--log-level warn" \
	timeout 120 "$REPO/interop/gateway.sh" start-proxy "$RUN/proxy" "$RUN/kube" || exit 1
# The admin's kubeconfig with the proxy's URL and serving CA.
python3 - "$RUN/kube/admin.kubeconfig" "$(cat "$RUN/proxy/url")" "$RUN/proxy/ca.crt" \
	>"$RUN/proxy.kubeconfig" <<'PY' || exit 1
import base64, sys
src, url, ca = sys.argv[1:4]
data = base64.b64encode(open(ca, "rb").read()).decode()
for line in open(src):
    key = line.strip().split(":", 1)[0]
    if key == "server":
        line = line[: line.index("server")] + f"server: {url}\n"
    elif key == "certificate-authority-data":
        line = line[: line.index("certificate-authority-data")] + f"certificate-authority-data: {data}\n"
    sys.stdout.write(line)
PY
ETCD_PID=$(cat "$RUN/kube/etcd.pid")
KUBE_PID=$(cat "$RUN/kube/kube-apiserver.pid")
echo "kube-apiserver pid $KUBE_PID, etcd pid $ETCD_PID, proxy pid $(cat "$RUN/proxy/gateway.pid")" >>"$OUT/machine.md"

render() { # NAME: the scenario with this run's kubeconfigs and pids (smaller with SMOKE)
	local smoke=()
	if [[ -n $SMOKE ]]; then
		smoke=(-e 's/^(  watchers:) 10000$/\1 500/' -e 's/^(  watchers:) 1000$/\1 200/'
			-e 's/^(  h2_connections:) 100$/\1 5/' -e 's/^(  h2_connections:) 10$/\1 2/'
			-e 's/^(  objects:) 10000$/\1 1000/' -e 's/^(  watchers:) 2000$/\1 200/' -e 's/^(  duration:) .*/\1 3s/'
			-e 's/^(  drain:) .*/\1 5s/')
	fi
	sed -E -e "s|@KUBE_KUBECONFIG@|$RUN/kube/admin.kubeconfig|" \
		-e "s|@PROXY_KUBECONFIG@|$RUN/proxy.kubeconfig|" \
		-e "s|@ETCD_PID@|$ETCD_PID|" -e "s|@KUBE_PID@|$KUBE_PID|" "${smoke[@]}" \
		"$SCEN/$1.yaml" >"$OUT/scenarios/$1.yaml"
}

LOADS=(fanout-1k-h2-json fanout-1k-h1-json fanout-10k-h2-json list-10k-rv0-json relist-storm-2k)
limit() { # NAME: seconds a compare of this load may take (both targets)
	case $1 in relist*) echo 600 ;; *) echo 420 ;; esac
}
for name in "${LOADS[@]}"; do
	if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]]; then continue; fi
	render "$name"
	log "== $name ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
	t0=$SECONDS
	timeout --kill-after=20 "$(limit "$name")" "$L" compare --scenario "$OUT/scenarios/$name.yaml" \
		--out "$OUT/$name" >"$OUT/$name.md" 2>"$OUT/$name.err" &
	CUR=$!
	wait "$CUR"
	rc=$?
	CUR=
	echo "| $name | $((SECONDS - t0)) s | exit $rc |" >>"$OUT/timings.md"
	((rc == 0)) || log "$name: exit $rc (see $OUT/$name.err)"
done
echo "end: $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.md"
log "reports in $OUT ($OUT/<load>.md)"
