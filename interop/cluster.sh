#!/usr/bin/env bash
# A simulated cluster beside a real kube-apiserver: its control plane (kube-controller-manager,
# kube-scheduler) and node agents (hollow kubelets and hollow kube-proxies from kubemark), each
# with the identity a real one has, pointed either at kube-apiserver directly or at svc-gateway
# proxies in front of it.
#
#   interop/cluster.sh up DIR direct|proxy   start etcd + kube-apiserver (kube.sh, with
#                                            NodeRestriction), the proxies (proxy mode), the
#                                            controller manager, the scheduler and the nodes;
#                                            returns once every hollow node is Ready
#   interop/cluster.sh down DIR              stop everything started in DIR
#   interop/cluster.sh kubeconfig DIR        print the admin kubeconfig of the target (the
#                                            proxy's in proxy mode)
#   interop/cluster.sh restart-upstream DIR  restart kube-apiserver (TERM, then the same flags,
#                                            port and etcd): a fault for the agents to ride out
#   interop/cluster.sh kill-proxy DIR I      SIGKILL the I-th proxy and start it again on its
#                                            port, with its flags and an empty cache
#
# Environment:
#   CLUSTER_HOLLOW_NODES     hollow kubelets (default 3; about 100 MiB each)
#   CLUSTER_HOLLOW_PROXIES   hollow kube-proxies (default 2)
#   CLUSTER_PROXIES          proxies in proxy mode, agents spread over them (default 1)
#   CLUSTER_SIM_NODES        simulated nodes in one process per target (cmd/simnodes: a
#                            kubelet's and a kube-proxy's requests, each node with its own
#                            certificate; default 0); each answers the tests on the address
#                            in DIR/simnodes-I.addr
#   CLUSTER_READY_TIMEOUT    seconds to wait for the nodes (default 120)
#   CLUSTER_COMPONENT_QPS    the controller manager's and scheduler's client QPS (burst twice
#                            that; default theirs, 20 and 50), for workloads of thousands of pods
#   SVC_GATEWAY_BIN          the gateway binary (see gateway.sh)
#
# Identities, as a cluster made by kubeadm has them: kubelets `system:node:<name>` in
# `system:nodes` (judged by the Node authorizer and NodeRestriction), kube-proxies
# `system:kube-proxy`, the controller manager `system:kube-controller-manager` with
# --use-service-account-credentials (each controller as its own ServiceAccount), the scheduler
# `system:kube-scheduler`; client certificates minted from the cluster CA, which the proxies
# take as their --client-ca-file.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
INTEROP_DIR=$HERE
# shellcheck source=lib.sh
source "$HERE/lib.sh"
log() { echo "cluster.sh: $*" >&2; }

K8S_DIR=$(dirname "$("$HERE/kube.sh" paths | head -n1)")

# mint DIR NAME CN [O]: a client certificate from the cluster CA in DIR/kube/pki, with a
# kubeconfig for SERVER (set by the caller) trusting SERVER_CA, at DIR/agents/NAME.kubeconfig.
mint() {
	local d=$1 name=$2 cn=$3 o=${4:-} subj
	local p=$d/kube/pki a=$d/agents
	mkdir -p "$a"
	subj="/CN=$cn"
	[[ -n $o ]] && subj="/O=$o/CN=$cn"
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$a/$name.key" \
		-out "$a/$name.csr" -subj "$subj" 2>/dev/null
	printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' >"$a/$name.ext"
	openssl x509 -req -in "$a/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
		-out "$a/$name.crt" -days 2 -extfile "$a/$name.ext" 2>/dev/null
	cat >"$a/$name.kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: c
		  cluster:
		    server: $SERVER
		    certificate-authority-data: $(base64 -w0 "$SERVER_CA")
		users:
		- name: u
		  user:
		    client-certificate-data: $(base64 -w0 "$a/$name.crt")
		    client-key-data: $(base64 -w0 "$a/$name.key")
		contexts:
		- name: x
		  context: {cluster: c, user: u}
		current-context: x
	EOF
}

# target DIR I: sets SERVER and SERVER_CA to the I-th target (a proxy, round robin, or the
# kube-apiserver directly).
target() {
	local d=$1 i=$2 n
	if [[ $(cat "$d/mode") == direct ]]; then
		SERVER=$(grep -m1 'server:' "$d/kube/admin.kubeconfig" | awk '{print $2}')
		SERVER_CA=$d/kube/pki/ca.crt
	else
		n=$(cat "$d/proxies")
		local p=$d/proxy-$((i % n))
		SERVER=$(cat "$p/url")
		SERVER_CA=$p/ca.crt
	fi
}

# spawn DIR NAME CMD...: runs CMD in the background, its log DIR/logs/NAME.log, pid in
# DIR/pids/NAME.pid.
spawn() {
	local d=$1 name=$2
	shift 2
	mkdir -p "$d/logs" "$d/pids"
	"$@" >>"$d/logs/$name.log" 2>&1 &
	echo $! >"$d/pids/$name.pid"
}

cmd_up() {
	local d=${1:?usage: cluster.sh up DIR direct|proxy} mode=${2:?usage: cluster.sh up DIR direct|proxy}
	case $mode in direct | proxy) ;; *)
		echo "mode: direct or proxy" >&2
		exit 2
		;;
	esac
	mkdir -p "$d"
	d=$(cd "$d" && pwd)
	"$HERE/kube.sh" build-components
	echo "$mode" >"$d/mode"
	local nodes=${CLUSTER_HOLLOW_NODES:-3} kproxies=${CLUSTER_HOLLOW_PROXIES:-2} proxies=${CLUSTER_PROXIES:-1}
	echo "$proxies" >"$d/proxies"
	KUBE_APISERVER_EXTRA_FLAGS="--enable-admission-plugins=NodeRestriction ${KUBE_APISERVER_EXTRA_FLAGS:-}" \
		"$HERE/kube.sh" start "$d/kube"
	if [[ $mode == proxy ]]; then
		local i
		for ((i = 0; i < proxies; i++)); do
			"$HERE/gateway.sh" start-proxy "$d/proxy-$i" "$d/kube"
		done
	fi
	target "$d" 0
	mint "$d" admin admin system:masters
	mint "$d" controller-manager system:kube-controller-manager
	mint "$d" scheduler system:kube-scheduler
	local qps=()
	if [[ -n ${CLUSTER_COMPONENT_QPS:-} ]]; then
		qps=(--kube-api-qps="$CLUSTER_COMPONENT_QPS" --kube-api-burst=$((CLUSTER_COMPONENT_QPS * 2)))
	fi
	spawn "$d" kube-controller-manager "$K8S_DIR/kube-controller-manager" \
		--kubeconfig="$d/agents/controller-manager.kubeconfig" \
		--use-service-account-credentials=true \
		--service-account-private-key-file="$d/kube/pki/sa.key" \
		--root-ca-file="$d/kube/pki/ca.crt" \
		--cluster-signing-cert-file="$d/kube/pki/ca.crt" --cluster-signing-key-file="$d/kube/pki/ca.key" \
		--leader-elect=false --secure-port=0 --controllers='*' \
		--allocate-node-cidrs=false --v=1 "${qps[@]}"
	spawn "$d" kube-scheduler "$K8S_DIR/kube-scheduler" \
		--kubeconfig="$d/agents/scheduler.kubeconfig" --leader-elect=false --secure-port=0 --v=1 "${qps[@]}"
	local i name
	for ((i = 0; i < nodes; i++)); do
		name=hollow-node-$i
		target "$d" "$i"
		mint "$d" "$name" "system:node:$name" system:nodes
		spawn "$d" "$name" "$K8S_DIR/kubemark" --morph=kubelet --name="$name" \
			--kubeconfig="$d/agents/$name.kubeconfig" --use-host-image-service=false \
			--kubelet-port="$(free_port)" --kubelet-read-only-port=0 --v=1
	done
	for ((i = 0; i < kproxies; i++)); do
		name=hollow-proxy-$i
		target "$d" "$i"
		mint "$d" "$name" system:kube-proxy
		spawn "$d" "$name" "$K8S_DIR/kubemark" --morph=proxy --name="hollow-node-$((i % (nodes > 0 ? nodes : 1)))" \
			--kubeconfig="$d/agents/$name.kubeconfig" --v=1
	done
	# Simulated nodes (cmd/simnodes), spread over the targets like the hollow ones: one
	# process per proxy, and as many directly (the same processes for both modes).
	local sims=${CLUSTER_SIM_NODES:-0} targets=$proxies per
	if ((sims > 0)); then
		(cd "$HERE" && go build -o "$d/simnodes" ./cmd/simnodes)
		per=$(((sims + targets - 1) / targets))
		for ((i = 0; i < targets; i++)); do
			target "$d" "$i"
			echo "127.0.0.1:$(free_port)" >"$d/simnodes-$i.addr"
			spawn "$d" "simnodes-$i" "$d/simnodes" --server "$SERVER" --ca "$SERVER_CA" \
				--client-ca "$d/kube/pki/ca.crt" --client-ca-key "$d/kube/pki/ca.key" \
				--status-addr "$(cat "$d/simnodes-$i.addr")" --compare-kubeconfig "$d/kube/admin.kubeconfig" \
				--first $((i * per)) --nodes $((i == targets - 1 ? sims - i * per : per))
		done
	fi
	local want=$((nodes + sims))
	local kc=$d/kube/admin.kubeconfig deadline=$((SECONDS + ${CLUSTER_READY_TIMEOUT:-120})) ready=0
	while ((SECONDS < deadline)); do
		ready=$(kubectl --kubeconfig "$kc" get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)
		((ready >= want)) && break
		sleep 1
	done
	if ((ready < want)); then
		log "$ready of $want nodes Ready after ${CLUSTER_READY_TIMEOUT:-120} s; logs in $d/logs"
		return 1
	fi
	log "$mode cluster up in $d: $nodes hollow nodes and $sims simulated ones Ready, $kproxies hollow kube-proxies"
}

cmd_down() {
	local d=${1:?usage: cluster.sh down DIR} f
	[[ -d $d ]] || return 0
	for f in "$d"/pids/*.pid; do
		[[ -f $f ]] && stop_pidfile "$f" 10
	done
	for f in "$d"/proxy-*; do
		[[ -d $f ]] && "$HERE/gateway.sh" stop "$f"
	done
	"$HERE/kube.sh" stop "$d/kube"
}

cmd_restart_upstream() {
	local d=${1:?usage: cluster.sh restart-upstream DIR}
	"$HERE/kube.sh" restart-apiserver "$d/kube"
}

cmd_kill_proxy() {
	local d=${1:?usage: cluster.sh kill-proxy DIR I} i=${2:?usage: cluster.sh kill-proxy DIR I}
	local p=$d/proxy-$i pid
	pid=$(cat "$p/gateway.pid")
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	rm -f "$p/gateway.pid"
	SVC_PROXY_EXTRA_FLAGS=$(cat "$p/flags") "$HERE/gateway.sh" start-proxy "$p" "$d/kube"
}

cmd_kubeconfig() {
	local d=${1:?usage: cluster.sh kubeconfig DIR}
	echo "$d/agents/admin.kubeconfig"
}

case "${1:-}" in
up) cmd_up "${2:-}" "${3:-}" ;;
down) cmd_down "${2:-}" ;;
kubeconfig) cmd_kubeconfig "${2:-}" ;;
restart-upstream) cmd_restart_upstream "${2:-}" ;;
kill-proxy) cmd_kill_proxy "${2:-}" "${3:-}" ;;
*)
	echo "usage: $0 up DIR direct|proxy | down DIR | kubeconfig DIR | restart-upstream DIR | kill-proxy DIR I" >&2
	exit 2
	;;
esac
