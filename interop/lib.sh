# Shared helpers of kube.sh, gateway.sh and run.sh (sourced). They need bash, coreutils and
# openssl only; curl and python3 are used when present.

# https_status HOST PORT PATH [CACERT CERT KEY]: the HTTP status code of a GET, or nothing.
https_status() {
	local host=$1 port=$2 path=$3 ca=${4:-} cert=${5:-} key=${6:-}
	if command -v curl >/dev/null 2>&1; then
		local args=(-s -o /dev/null -w '%{http_code}' --max-time 5)
		if [[ -n $ca ]]; then args+=(--cacert "$ca"); else args+=(-k); fi
		if [[ -n $cert ]]; then args+=(--cert "$cert" --key "$key"); fi
		curl "${args[@]}" "https://$host:$port$path" 2>/dev/null || true
	else
		local args=(-quiet -connect "$host:$port" -servername localhost)
		if [[ -n $cert ]]; then args+=(-cert "$cert" -key "$key"); fi
		printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$host" |
			timeout 5 openssl s_client "${args[@]}" 2>/dev/null | head -n1 | awk '{print $2}' || true
	fi
}

# http_get HOST PORT PATH: the body of a plain-HTTP GET (bash's /dev/tcp; no curl needed).
http_get() {
	local host=$1 port=$2 path=$3
	(
		exec 3<>"/dev/tcp/$host/$port" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$host" >&3
		timeout 5 cat <&3
	) 2>/dev/null || true
}

# free_port: a free TCP port for a server to listen on, below the kernel's range of ephemeral
# ports (ip_local_port_range), so that no outgoing connection takes it between this check and
# the server's bind: a cluster of thousands of nodes opens tens of thousands of connections,
# and a hollow kubelet given a port from that range found it taken.
free_port() {
	python3 -c '
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    low = 32768
for _ in range(1000):
    port = random.randrange(10000, max(low, 10001))
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below the ephemeral range")
' 2>/dev/null || (cd "$INTEROP_DIR/build/freeport" && go run .)
}

# stop_pidfile FILE [TIMEOUT]: TERM the process, KILL it after TIMEOUT seconds, remove FILE.
stop_pidfile() {
	local f=$1 timeout=${2:-15} pid
	[[ -f $f ]] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		local deadline=$((SECONDS + timeout))
		while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then
			echo "pid $pid did not end after TERM; KILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$f"
}
