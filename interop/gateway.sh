#!/usr/bin/env bash
# Starts and stops the svc gateway for the interop tests, the way kube.sh does kube-apiserver.
#
#   interop/gateway.sh start DIR   start it on 127.0.0.1 with its data in DIR/data; the port is
#                                  chosen once and kept in DIR/port, so a restart keeps it;
#                                  returns once /readyz answers 200; DIR/admin.kubeconfig
#   interop/gateway.sh stop DIR    end it by pid (TERM, then KILL)
#   interop/gateway.sh start-proxy DIR UPSTREAM
#                                  start it in proxy mode in front of the kube-apiserver that
#                                  kube.sh started in UPSTREAM (its admin kubeconfig is the
#                                  proxy's own identity, its CA the client CA); DIR/url and
#                                  DIR/ca.crt (the proxy's serving CA) are written, and its extra
#                                  flags in DIR/flags; stop as above
#
# Environment:
#   SVC_GATEWAY_BIN            the binary (default: built with cargo into $CARGO_TARGET_DIR)
#   SVC_GATEWAY_EXTRA_FLAGS    extra flags (word-split), e.g. --watch-cache-history-window=2s
#   SVC_PROXY_EXTRA_FLAGS      extra flags of start-proxy (word-split)
#   GATEWAY_READY_TIMEOUT      seconds to wait for /readyz (default 60)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
INTEROP_DIR=$HERE
# shellcheck source=lib.sh
source "$HERE/lib.sh"
log() { echo "gateway.sh: $*" >&2; }

gateway_bin() {
	if [[ -n ${SVC_GATEWAY_BIN:-} ]]; then
		echo "$SVC_GATEWAY_BIN"
		return
	fi
	local target=${CARGO_TARGET_DIR:-$REPO/target}
	if [[ ! -x $target/debug/svc-gateway ]]; then
		log "building svc-gateway with cargo (CARGO_TARGET_DIR=$target) ..."
		(cd "$REPO" && CARGO_TARGET_DIR=$target cargo build -q -p svc-gateway >&2)
	fi
	echo "$target/debug/svc-gateway"
}

# launch DIR READY_FILE [FLAG...]: starts the gateway on 127.0.0.1 with its data in DIR/data, on
# the port kept in DIR/port (chosen once), with the flags given; returns once READY_FILE exists
# and /readyz answers 200 (at once when it already runs in DIR). Sets PORT.
launch() {
	local d=$1 ready=$2 bin
	shift 2
	bin=$(gateway_bin)
	if [[ -f $d/port ]]; then PORT=$(cat "$d/port"); else PORT=$(free_port); fi
	echo "$PORT" >"$d/port"
	if [[ -f $d/gateway.pid ]] && kill -0 "$(cat "$d/gateway.pid")" 2>/dev/null; then
		log "already running in $d"
		return 0
	fi
	"$bin" --data-dir "$d/data" --bind-address 127.0.0.1 --secure-port "$PORT" "$@" >>"$d/gateway.log" 2>&1 &
	echo $! >"$d/gateway.pid"
	local pid deadline=$((SECONDS + ${GATEWAY_READY_TIMEOUT:-60}))
	pid=$(cat "$d/gateway.pid")
	while ((SECONDS < deadline)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "svc-gateway exited; log tail:"
			tail -n 40 "$d/gateway.log" >&2
			return 1
		fi
		if [[ -f $ready && $(https_status 127.0.0.1 "$PORT" /readyz) == 200 ]]; then
			return 0
		fi
		sleep 0.2
	done
	log "svc-gateway not ready after ${GATEWAY_READY_TIMEOUT:-60} s; log tail:"
	tail -n 40 "$d/gateway.log" >&2
	cmd_stop "$d"
	return 1
}

cmd_start() {
	local d=${1:?usage: gateway.sh start DIR}
	mkdir -p "$d"
	d=$(cd "$d" && pwd)
	# shellcheck disable=SC2086
	launch "$d" "$d/data/admin.kubeconfig" ${SVC_GATEWAY_EXTRA_FLAGS:-} || return 1
	cp "$d/data/admin.kubeconfig" "$d/admin.kubeconfig"
	log "svc-gateway ready at https://127.0.0.1:$PORT (kubeconfig $d/admin.kubeconfig)"
}

cmd_start_proxy() {
	local d=${1:?usage: gateway.sh start-proxy DIR UPSTREAM} up=${2:?usage: gateway.sh start-proxy DIR UPSTREAM}
	mkdir -p "$d"
	d=$(cd "$d" && pwd)
	up=$(cd "$up" && pwd)
	# shellcheck disable=SC2086
	launch "$d" "$d/data/pki/ca.crt" --upstream-kubeconfig "$up/admin.kubeconfig" \
		--client-ca-file "$up/pki/ca.crt" ${SVC_PROXY_EXTRA_FLAGS:-} || return 1
	echo "${SVC_PROXY_EXTRA_FLAGS:-}" >"$d/flags"
	cp "$d/data/pki/ca.crt" "$d/ca.crt"
	echo "https://127.0.0.1:$PORT" >"$d/url"
	log "svc-gateway proxy ready at https://127.0.0.1:$PORT in front of $(grep -m1 server: "$up/admin.kubeconfig" | awk '{print $2}')"
}

cmd_stop() {
	local d=${1:?usage: gateway.sh stop DIR}
	stop_pidfile "$d/gateway.pid" "${GATEWAY_STOP_TIMEOUT:-15}"
}

case "${1:-}" in
start) cmd_start "${2:-}" ;;
start-proxy) cmd_start_proxy "${2:-}" "${3:-}" ;;
stop) cmd_stop "${2:-}" ;;
bin) gateway_bin ;;
*)
	echo "usage: $0 start DIR | start-proxy DIR UPSTREAM | stop DIR | bin" >&2
	exit 2
	;;
esac
