#!/usr/bin/env bash
# The simulated cluster of interop/cluster.sh measured the same way directly against
# kube-apiserver and through svc-gateway proxies, in one run: interop/cluster/'s workload on
# each (pod startup as a watcher sees it, the Deployment's rollout, scale-down and delete),
# and around it the CPU seconds and peak resident memory of kube-apiserver, etcd and the
# proxies (from /proc), and the watches open on kube-apiserver (its own metrics). Then, with
# simulated nodes, the faults of cluster/'s TestFaults: kube-apiserver restarted and (through
# proxies) a proxy killed with SIGKILL, the simulated nodes' relists and 410s counted, and
# every informer store compared with a direct list.
#
#   scripts/measure-cluster.sh                 # 3 hollow nodes, 2 kube-proxies, 30 pods
#   NODES=10 KPROXIES=5 SIMS=500 PODS=500 PROXIES=2 scripts/measure-cluster.sh
#
# Environment: NODES (hollow kubelets), KPROXIES (hollow kube-proxies), SIMS (simulated nodes,
# interop/cmd/simnodes), PODS, PROXIES (proxy mode), MODES (default "direct proxy"),
# CLUSTER_COMPONENT_QPS (the controller manager's and scheduler's, for thousands of pods),
# OUT (default /tmp/svc-cluster), SVC_GATEWAY_BIN (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
NODES=${NODES:-3} KPROXIES=${KPROXIES:-2} SIMS=${SIMS:-0} PODS=${PODS:-$((NODES * 10))} PROXIES=${PROXIES:-1}
OUT=${OUT:-/tmp/svc-cluster}
# The tests' limits grow with the pods (cluster_test.go's scaled), and so does theirs.
TIMEOUT=$((900 * ((PODS + 499) / 500)))s
mkdir -p "$OUT"
if [[ -z ${SVC_GATEWAY_BIN:-} ]]; then
	cargo build --release -q -p svc-gateway
	export SVC_GATEWAY_BIN=$REPO/target/release/svc-gateway
fi
(cd interop && go test -c -o "$OUT/cluster.test" ./cluster)

# sum A B / diff A B: arithmetic on decimals.
sum() { awk -v a="$1" -v b="$2" 'BEGIN { print a + b }'; }
diff() { awk -v a="$1" -v b="$2" 'BEGIN { print a - b }'; }
# cpu PIDFILE: the process's user+system CPU seconds so far.
cpu() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || { echo 0; return; }
	awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$pid/stat" 2>/dev/null || echo 0
}
# hwm PIDFILE: the process's peak resident memory, MiB.
hwm() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || { echo 0; return; }
	awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status" 2>/dev/null || echo 0
}

for mode in ${MODES:-direct proxy}; do
	d=$OUT/$mode
	interop/cluster.sh down "$d" >/dev/null 2>&1 || true
	rm -rf "$d"
	CLUSTER_HOLLOW_NODES=$NODES CLUSTER_HOLLOW_PROXIES=$KPROXIES CLUSTER_PROXIES=$PROXIES CLUSTER_SIM_NODES=$SIMS \
		CLUSTER_READY_TIMEOUT=${CLUSTER_READY_TIMEOUT:-300} interop/cluster.sh up "$d" "$mode"
	before_kube=$(cpu "$d/kube/kube-apiserver.pid") before_etcd=$(cpu "$d/kube/etcd.pid")
	before_proxy=0
	for p in "$d"/proxy-*/gateway.pid; do
		[[ -f $p ]] && before_proxy=$(sum "$before_proxy" "$(cpu "$p")")
	done
	(
		cd interop/cluster
		CLUSTER_KUBECONFIG=$d/agents/admin.kubeconfig CLUSTER_MODE=$mode CLUSTER_NODES=$((NODES + SIMS)) CLUSTER_DIR=$d \
			CLUSTER_PODS=$PODS CLUSTER_UPSTREAM_KUBECONFIG=$d/kube/admin.kubeconfig \
			"$OUT/cluster.test" -test.v -test.count=1 -test.timeout=$TIMEOUT -test.run TestWorkload
	) | tee "$OUT/$mode.log" | grep -E "cluster:|upstream|FAIL|ok|PASS" || true
	kube=$(diff "$(cpu "$d/kube/kube-apiserver.pid")" "$before_kube")
	etcd=$(diff "$(cpu "$d/kube/etcd.pid")" "$before_etcd")
	proxy=0 proxy_rss=0
	for p in "$d"/proxy-*/gateway.pid; do
		[[ -f $p ]] || continue
		proxy=$(sum "$proxy" "$(cpu "$p")")
		proxy_rss=$((proxy_rss + $(hwm "$p")))
	done
	proxy=$(diff "$proxy" "$before_proxy")
	echo "resources: mode=$mode kube_apiserver_cpu_s=$kube kube_apiserver_peak_rss_mib=$(hwm "$d/kube/kube-apiserver.pid") etcd_cpu_s=$etcd proxies_cpu_s=$proxy proxies_peak_rss_mib=$proxy_rss" |
		tee -a "$OUT/$mode.log"
	# The faults last: they restart kube-apiserver (a new process) and kill a proxy.
	(
		cd interop/cluster
		CLUSTER_KUBECONFIG=$d/agents/admin.kubeconfig CLUSTER_MODE=$mode CLUSTER_DIR=$d CLUSTER_PODS=$PODS \
			"$OUT/cluster.test" -test.v -test.count=1 -test.timeout=$TIMEOUT -test.run TestFaults
	) | tee -a "$OUT/$mode.log" | grep -E "fault:|stores:|FAIL|ok|PASS" || true
	# How each proxy's TLS handshakes ended (the killed one's since its restart).
	for p in "$d"/proxy-*; do
		[[ -f $p/url ]] || continue
		curl -s --max-time 20 --cacert "$p/ca.crt" --cert "$d/agents/admin.crt" --key "$d/agents/admin.key" \
			"$(cat "$p/url")/metrics" | grep '^svc_tls_handshakes_total' |
			sed "s|^|handshakes: $(basename "$p") |" | tee -a "$OUT/$mode.log" || true
	done
	interop/cluster.sh down "$d" >/dev/null 2>&1 || true
done
