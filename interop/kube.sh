#!/usr/bin/env bash
# The one way every interop test and benchmark starts a real Kubernetes API server.
#
#   interop/kube.sh build        build kube-apiserver and etcd into the cache (instant once built)
#   interop/kube.sh build-components
#                                also kube-scheduler, kube-controller-manager and kubemark, from
#                                the same module (about five more minutes the first time)
#   interop/kube.sh start DIR    start etcd + kube-apiserver on 127.0.0.1; writes DIR/admin.kubeconfig,
#                                DIR/ca.crt, pid files and logs; returns once /readyz answers 200
#   interop/kube.sh stop DIR     end them by pid (TERM, then KILL)
#   interop/kube.sh restart-apiserver DIR
#                                stop kube-apiserver (TERM) and start it again on the same port,
#                                etcd and flags, as an operator's rolling restart does; returns
#                                once /readyz answers 200
#   interop/kube.sh paths        print the cached binaries' paths
#
# Environment:
#   SVC_INTEROP_CACHE            cache root (default $HOME/.cache/svc-interop)
#   KUBE_APISERVER_EXTRA_FLAGS   extra kube-apiserver flags (word-split), e.g. --etcd-compaction-interval=10s
#   KUBE_READY_TIMEOUT           seconds to wait for /readyz (default 120)
#   KUBE_BUILD_PARALLELISM       go build -p (default: number of CPUs)
#
# Needs only Go (modules come from the module proxy) and openssl.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
CACHE="${SVC_INTEROP_CACHE:-$HOME/.cache/svc-interop}"
K8S_DIR="$CACHE/k8s-$K8S_VERSION"
ETCD_DIR="$CACHE/etcd-$ETCD_VERSION"
KUBE_APISERVER="$K8S_DIR/kube-apiserver"
ETCD="$ETCD_DIR/etcd"

INTEROP_DIR=$HERE
# shellcheck source=lib.sh
source "$HERE/lib.sh"
log() { echo "kube.sh: $*" >&2; }

build_one() { # name module-dir out-binary package ldflags
	local name=$1 dir=$2 out=$3 pkg=$4 ldflags=$5
	if [[ -x $out ]]; then
		return 0
	fi
	mkdir -p "$(dirname "$out")"
	log "building $name (slow the first time on a small machine) ..."
	local start=$SECONDS
	(
		cd "$dir"
		# -mod=readonly: the committed go.sum pins every module.
		CGO_ENABLED=0 go build -mod=readonly -p "${KUBE_BUILD_PARALLELISM:-$(nproc)}" \
			-trimpath -ldflags="-s -w $ldflags" -o "$out.tmp" "$pkg"
	)
	mv "$out.tmp" "$out"
	log "built $name in $((SECONDS - start)) s: $out"
}

cmd_build() {
	local v=${K8S_VERSION#v} minor
	minor=$(echo "$v" | cut -d. -f2)
	build_one kube-apiserver "$HERE/build/kube-apiserver" "$KUBE_APISERVER" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		"-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
	build_one etcd "$HERE/build/etcd" "$ETCD" . ""
}

# The cluster's other components, from the same k8s.io/kubernetes module as kube-apiserver:
# the scheduler, the controller manager, and kubemark (hollow kubelets and kube-proxies).
cmd_build_components() {
	cmd_build
	local v=${K8S_VERSION#v} minor name
	minor=$(echo "$v" | cut -d. -f2)
	for name in kube-scheduler kube-controller-manager kubemark; do
		build_one "$name" "$HERE/build/kube-apiserver" "$K8S_DIR/$name" \
			"k8s.io/kubernetes/cmd/$name" \
			"-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
	done
}

gen_pki() { # DIR
	local d=$1
	[[ -f $d/pki/ca.crt ]] && return 0
	mkdir -p "$d/pki"
	local p=$d/pki
	(
		cd "$p"
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
			-subj "/CN=interop-ca" -addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
		# serving certificate for 127.0.0.1 / localhost (also used by etcd)
		openssl req -newkey rsa:2048 -nodes -keyout serving.key -out serving.csr -subj "/CN=kube-apiserver" 2>/dev/null
		cat >serving.ext <<-EOF
			basicConstraints=CA:FALSE
			keyUsage=critical,digitalSignature,keyEncipherment
			extendedKeyUsage=serverAuth,clientAuth
			subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1
		EOF
		openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out serving.crt -days 3650 -extfile serving.ext 2>/dev/null
		# admin client certificate
		openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin" 2>/dev/null
		printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
		openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 3650 -extfile client.ext 2>/dev/null
		# service-account signing keys
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
		rm -f ./*.csr
	)
	cp "$p/ca.crt" "$d/ca.crt"
}

b64() { base64 -w0 <"$1"; }

wait_ready() { # port path log pid
	local port=$1 path=$2 logf=$3 pid=$4 deadline=$((SECONDS + ${KUBE_READY_TIMEOUT:-120}))
	while ((SECONDS < deadline)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "process $pid exited; log tail:"
			tail -n 40 "$logf" >&2
			return 1
		fi
		if [[ $(https_status 127.0.0.1 "$port" "$path" "$D/pki/ca.crt" "$D/pki/admin.crt" "$D/pki/admin.key") == 200 ]]; then
			return 0
		fi
		sleep 0.5
	done
	log "https://127.0.0.1:$port$path not ready after ${KUBE_READY_TIMEOUT:-120} s; log tail:"
	tail -n 40 "$logf" >&2
	return 1
}

# apiserver: start kube-apiserver on $D's port, in front of $D's etcd, with the extra flags
# kept in $D/apiserver.flags; returns once /readyz answers 200.
apiserver() {
	local port etcd_url flags
	port=$(cat "$D/port")
	etcd_url=$(cat "$D/etcd.url")
	flags=$(cat "$D/apiserver.flags")
	# shellcheck disable=SC2086
	"$KUBE_APISERVER" \
		--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
		--etcd-servers="$etcd_url" \
		--cert-dir="$D/pki" --tls-cert-file="$D/pki/serving.crt" --tls-private-key-file="$D/pki/serving.key" \
		--client-ca-file="$D/pki/ca.crt" \
		--authorization-mode=Node,RBAC \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$D/pki/sa.pub" \
		--service-account-signing-key-file="$D/pki/sa.key" \
		--api-audiences=https://kubernetes.default.svc.cluster.local \
		--service-cluster-ip-range=10.0.0.0/24 \
		--allow-privileged=false \
		--enable-priority-and-fairness=false \
		--profiling=false \
		--endpoint-reconciler-type=none \
		--v=1 \
		$flags >>"$D/kube-apiserver.log" 2>&1 &
	echo $! >"$D/kube-apiserver.pid"

	wait_ready "$port" /readyz "$D/kube-apiserver.log" "$(cat "$D/kube-apiserver.pid")"
}

cmd_start() {
	D=${1:?usage: kube.sh start DIR}
	mkdir -p "$D"
	D=$(cd "$D" && pwd)
	cmd_build
	if [[ -f $D/kube-apiserver.pid ]] && kill -0 "$(cat "$D/kube-apiserver.pid")" 2>/dev/null; then
		log "already running in $D"
		return 0
	fi
	gen_pki "$D"
	local etcd_client etcd_peer port
	etcd_client=$(free_port)
	etcd_peer=$(free_port)
	# Reuse the apiserver port across restarts of the same DIR when it is still free.
	if [[ -f $D/port ]]; then port=$(cat "$D/port"); else port=$(free_port); fi
	echo "$port" >"$D/port"

	mkdir -p "$D/etcd"
	"$ETCD" --name interop --data-dir "$D/etcd" \
		--listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
		--listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
		--initial-cluster "interop=http://127.0.0.1:$etcd_peer" \
		--listen-metrics-urls "" --quota-backend-bytes 8589934592 \
		--log-level warn >>"$D/etcd.log" 2>&1 &
	echo $! >"$D/etcd.pid"
	echo "http://127.0.0.1:$etcd_client" >"$D/etcd.url"
	local deadline=$((SECONDS + 30))
	until http_get 127.0.0.1 "$etcd_client" /health | grep -q '"health":"true"'; do
		if ((SECONDS > deadline)) || ! kill -0 "$(cat "$D/etcd.pid")" 2>/dev/null; then
			log "etcd did not start; log tail:"
			tail -n 40 "$D/etcd.log" >&2
			return 1
		fi
		sleep 0.2
	done

	echo "${KUBE_APISERVER_EXTRA_FLAGS:-}" >"$D/apiserver.flags"
	cat >"$D/admin.kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: kube-apiserver
		  cluster:
		    server: https://127.0.0.1:$port
		    certificate-authority-data: $(b64 "$D/pki/ca.crt")
		users:
		- name: admin
		  user:
		    client-certificate-data: $(b64 "$D/pki/admin.crt")
		    client-key-data: $(b64 "$D/pki/admin.key")
		contexts:
		- name: admin
		  context: {cluster: kube-apiserver, user: admin}
		current-context: admin
	EOF

	apiserver || {
		cmd_stop "$D"
		return 1
	}
	log "kube-apiserver ready at https://127.0.0.1:$port (kubeconfig $D/admin.kubeconfig)"
}

cmd_restart_apiserver() {
	D=${1:?usage: kube.sh restart-apiserver DIR}
	D=$(cd "$D" && pwd)
	stop_pidfile "$D/kube-apiserver.pid" "${KUBE_STOP_TIMEOUT:-15}"
	apiserver || return 1
	log "kube-apiserver restarted at https://127.0.0.1:$(cat "$D/port")"
}

cmd_stop() {
	local d=${1:?usage: kube.sh stop DIR}
	stop_pidfile "$d/kube-apiserver.pid" "${KUBE_STOP_TIMEOUT:-15}"
	stop_pidfile "$d/etcd.pid" "${KUBE_STOP_TIMEOUT:-15}"
}

case "${1:-}" in
build) cmd_build ;;
build-components) cmd_build_components ;;
start) cmd_start "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
restart-apiserver) cmd_restart_apiserver "${2:-}" ;;
paths) echo "$KUBE_APISERVER" && echo "$ETCD" ;;
*)
	echo "usage: $0 build | start DIR | stop DIR | paths" >&2
	exit 2
	;;
esac
