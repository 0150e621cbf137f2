#!/usr/bin/env bash
# Runs the client-go conformance tests against kube-apiserver (to prove each test right) and
# against the svc gateway (to test it), then the differential runner (diff/) against both at
# once, then the proxy-mode tests (proxy/: the gateway with --upstream-kubeconfig in front of a
# kube-apiserver of its own), then a simulated cluster directly and through a proxy
# (cluster.sh, cluster/), and ends with one line "N passed, N failed" over all of them.
#
#   interop/run.sh
#
# Builds what is missing first (kube-apiserver and etcd into the cache of kube.sh; the gateway
# with cargo unless SVC_GATEWAY_BIN names a binary), starts both servers on 127.0.0.1 in a
# temporary directory, and stops them on exit. Needs Go, Rust (for the gateway) and openssl;
# the proxy tests also python3 with the kubernetes package, and Node with npm.
#
# Environment:
#   SVC_GATEWAY_BIN        gateway binary to test (default: cargo build -p svc-gateway)
#   CARGO_TARGET_DIR       where cargo builds it (default: <repo>/target)
#   INTEROP_KEEP=1         keep the temporary directory (logs, data) after the run
#   INTEROP_TARGETS        which targets to run (default "kube-apiserver svc-gateway")
#   INTEROP_TEST_RUN       a -test.run pattern (default: every test)
#   INTEROP_DIFF=0         skip the differential runner (it runs when both targets do)
#   INTEROP_DIFF_RUN       a pattern of scenarios for it, e.g. 'watch|chunking' (default: all)
#   INTEROP_PROXY=0        skip the proxy-mode tests
#   INTEROP_PROXY_RUN      a -test.run pattern for them (default: every test)
#   INTEROP_PROXY_COUNT    run them this many times over, to shake out timing faults (default 1)
#   INTEROP_CLUSTER=0      skip the simulated cluster (cluster.sh and cluster/: the controller
#                          manager, the scheduler, hollow nodes and CLUSTER_SIM_NODES simulated
#                          ones (default 100), directly and through a proxy; CLUSTER_PODS pods,
#                          default 60; kube-apiserver restarted and the proxy killed midway)
#   INTEROP_SKIP_PYTHON=1  skip the proxy test with the Python client when python3 lacks kubernetes
#   INTEROP_SKIP_NODE=1    skip the proxy test with the JavaScript client when node or npm is missing
#                          (it runs `npm ci` in proxy/clients/node once; otherwise both fail)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/svc-interop.XXXXXX")
log() { echo "run.sh: $*" >&2; }

# The gateway runs with a 2 s watch-cache history window (so the restart test can force a 410
# quickly), a short shutdown, and WatchList on: the spec has streaming lists off by default,
# kube-apiserver 1.37 has them on, and the WatchList test is about the streaming path.
# Both servers run with the alpha gate CBORServingAndStorage on, for TestCBORCoreGroup.
GATEWAY_FLAGS="--watch-cache-history-window=2s --shutdown-timeout=5s --feature-gates=WatchList=true,CBORServingAndStorage=true"
export KUBE_APISERVER_EXTRA_FLAGS="--feature-gates=CBORServingAndStorage=true ${KUBE_APISERVER_EXTRA_FLAGS:-}"

summarized=
cleanup() {
	local rc=$?
	if [[ -z $summarized ]]; then
		# Stopped before the tests ran (a build failed, or interrupted): still end with the line.
		echo "0 passed, 1 failed"
		((rc != 0)) || rc=1
	fi
	"$HERE/gateway.sh" stop "$WORK/svc-gateway" >/dev/null 2>&1 || true
	"$HERE/kube.sh" stop "$WORK/kube-apiserver" >/dev/null 2>&1 || true
	"$HERE/gateway.sh" stop "$WORK/proxy" >/dev/null 2>&1 || true
	"$HERE/kube.sh" stop "$WORK/proxy-upstream" >/dev/null 2>&1 || true
	"$HERE/cluster.sh" down "$WORK/cluster-direct" >/dev/null 2>&1 || true
	"$HERE/cluster.sh" down "$WORK/cluster-proxy" >/dev/null 2>&1 || true
	if [[ -n ${INTEROP_KEEP:-} ]]; then
		log "kept $WORK"
	else
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$SECONDS
"$HERE/kube.sh" build
SVC_GATEWAY_BIN=$("$HERE/gateway.sh" bin)
export SVC_GATEWAY_BIN
export SVC_GATEWAY_EXTRA_FLAGS="$GATEWAY_FLAGS ${SVC_GATEWAY_EXTRA_FLAGS:-}"
(
	cd "$HERE"
	go test -c -o "$WORK/clientgo.test" ./clientgo
	go test -c -o "$WORK/diff.test" ./diff
	go test -c -o "$WORK/proxy.test" ./proxy
	go build -o "$WORK/testsummary" ./cmd/testsummary
)
log "built in $((SECONDS - start)) s"

run_target() { # name
	local name=$1 dir=$WORK/$1 suffix restart
	case $name in
	kube-apiserver)
		suffix=k8s.io
		restart="'$HERE/kube.sh' stop '$dir' && '$HERE/kube.sh' start '$dir'"
		"$HERE/kube.sh" start "$dir" || return 1
		;;
	svc-gateway)
		suffix=svc.io
		restart="'$HERE/gateway.sh' stop '$dir' && '$HERE/gateway.sh' start '$dir'"
		"$HERE/gateway.sh" start "$dir" || return 1
		;;
	*)
		log "unknown target $name"
		return 1
		;;
	esac
	local t0=$SECONDS
	# The test binary runs in the package directory, as go test runs it.
	(
		cd "$HERE/clientgo"
		INTEROP_TARGET=$name INTEROP_KUBECONFIG=$dir/admin.kubeconfig INTEROP_GROUP_SUFFIX=$suffix \
			INTEROP_RESTART_CMD=$restart \
			go tool test2json -t -p "$name" "$WORK/clientgo.test" -test.v=test2json -test.count=1 \
			-test.timeout=150s ${INTEROP_TEST_RUN:+-test.run "$INTEROP_TEST_RUN"} >"$WORK/$name.json" 2>&1
	) || true
	log "$name: tests took $((SECONDS - t0)) s"
}

stop_target() { # name
	case $1 in
	kube-apiserver) "$HERE/kube.sh" stop "$WORK/$1" ;;
	svc-gateway) "$HERE/gateway.sh" stop "$WORK/$1" ;;
	esac
}

# The differential runner needs both servers at once: each target is left running after its
# tests when it will run, and it uses the same servers (its namespaces are its own).
targets=${INTEROP_TARGETS:-kube-apiserver svc-gateway}
diff=
if [[ ${INTEROP_DIFF:-1} != 0 && " $targets " == *" kube-apiserver "* && " $targets " == *" svc-gateway "* ]]; then
	diff=1
fi

args=()
for name in $targets; do
	if ! run_target "$name"; then
		log "$name did not start"
	fi
	[[ -n $diff ]] || stop_target "$name"
	args+=("$name=$WORK/$name.json")
done

if [[ -n $diff ]]; then
	t0=$SECONDS
	(
		cd "$HERE/diff"
		INTEROP_DIFF_KUBE_KUBECONFIG=$WORK/kube-apiserver/admin.kubeconfig \
			INTEROP_DIFF_GATEWAY_KUBECONFIG=$WORK/svc-gateway/admin.kubeconfig \
			go tool test2json -t -p differential "$WORK/diff.test" -test.v=test2json -test.count=1 \
			-test.timeout=300s ${INTEROP_DIFF_RUN:+-test.run "TestDiff/($INTEROP_DIFF_RUN|explained)"} >"$WORK/differential.json" 2>&1
	) || true
	log "differential: took $((SECONDS - t0)) s"
	stop_target kube-apiserver
	stop_target svc-gateway
	args+=("differential=$WORK/differential.json")
fi
# Proxy mode: a kube-apiserver of its own as the upstream (the tests create RBAC objects and
# CRDs there), the gateway in front of it.
if [[ ${INTEROP_PROXY:-1} != 0 ]]; then
	t0=$SECONDS
	if "$HERE/kube.sh" start "$WORK/proxy-upstream" && "$HERE/gateway.sh" start-proxy "$WORK/proxy" "$WORK/proxy-upstream"; then
		(
			cd "$HERE/proxy"
			INTEROP_UPSTREAM_KUBECONFIG=$WORK/proxy-upstream/admin.kubeconfig \
				INTEROP_UPSTREAM_PKI=$WORK/proxy-upstream/pki INTEROP_UPSTREAM_DIR=$WORK/proxy-upstream \
				INTEROP_PROXY_DIR=$WORK/proxy \
				INTEROP_PROXY_URL=$(cat "$WORK/proxy/url") INTEROP_PROXY_CA=$WORK/proxy/ca.crt \
				go tool test2json -t -p proxy "$WORK/proxy.test" -test.v=test2json \
				-test.count="${INTEROP_PROXY_COUNT:-1}" -test.timeout="$((300 * ${INTEROP_PROXY_COUNT:-1}))s" \
				${INTEROP_PROXY_RUN:+-test.run "$INTEROP_PROXY_RUN"} >"$WORK/proxy.json" 2>&1
		) || true
	else
		log "the proxy or its upstream did not start"
	fi
	"$HERE/gateway.sh" stop "$WORK/proxy"
	"$HERE/kube.sh" stop "$WORK/proxy-upstream"
	log "proxy: took $((SECONDS - t0)) s"
	args+=("proxy=$WORK/proxy.json")
fi
# A simulated cluster (cluster.sh): the controller manager, the scheduler, hollow kubelets and
# kube-proxies with their own identities, directly against kube-apiserver and then through a
# proxy, the same workload on each (cluster/).
if [[ ${INTEROP_CLUSTER:-1} != 0 ]]; then
	t0=$SECONDS
	"$HERE/kube.sh" build-components
	(cd "$HERE" && go test -c -o "$WORK/cluster.test" ./cluster)
	export CLUSTER_SIM_NODES=${CLUSTER_SIM_NODES:-100}
	for mode in direct proxy; do
		if "$HERE/cluster.sh" up "$WORK/cluster-$mode" "$mode"; then
			(
				cd "$HERE/cluster"
				CLUSTER_KUBECONFIG=$("$HERE/cluster.sh" kubeconfig "$WORK/cluster-$mode") CLUSTER_MODE=$mode \
					CLUSTER_UPSTREAM_KUBECONFIG=$WORK/cluster-$mode/kube/admin.kubeconfig \
					CLUSTER_NODES=$((${CLUSTER_HOLLOW_NODES:-3} + CLUSTER_SIM_NODES)) CLUSTER_DIR=$WORK/cluster-$mode \
					CLUSTER_PODS=${CLUSTER_PODS:-60} \
					go tool test2json -t -p "cluster-$mode" "$WORK/cluster.test" -test.v=test2json \
					-test.count=1 -test.timeout=600s >"$WORK/cluster-$mode.json" 2>&1
			) || true
		else
			log "the $mode cluster did not start"
		fi
		"$HERE/cluster.sh" down "$WORK/cluster-$mode"
		args+=("cluster-$mode=$WORK/cluster-$mode.json")
	done
	log "cluster: took $((SECONDS - t0)) s"
fi
log "whole run took $((SECONDS - start)) s"
summarized=1
"$WORK/testsummary" "${args[@]}"
