# The TLS clusters of the benchmarks that start many agents (scale, podset): sourced after bench-lib.sh,
# with BENCH (the benchmark's name) set. Each agent has a KEY (v1, w3, ...): PID, NAME, DIR, API, METRICS and
# CLIENT hold its process, node name, data dir and ports; everything under WORK goes at exit.

die() { echo "$BENCH: $*" >&2; exit 1; }
WORK="$(mktemp -d "/tmp/hostlet-bench-$BENCH.XXXXXX")"
PIDS=()        # every agent started, for the clean-up
NODES=()       # every node name used, for the containers' clean-up
declare -A PID NAME DIR API METRICS CLIENT USED_PORT

# Stops the agents in the arguments: SIGTERM, then SIGKILL for those still running 20 s later.
stop_agents() {
  local p deadline
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  deadline=$((SECONDS + 20))
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}
# Processes (etcd children) still running from a data dir under WORK, by their command line.
leftovers() {
  local f p
  for f in /proc/[0-9]*/cmdline; do
    p=${f#/proc/}; p=${p%/cmdline}
    [ "$p" = "$$" ] && continue
    if tr '\0' ' ' <"$f" 2>/dev/null | grep -q -- "--data-dir[= ]$WORK/"; then echo "$p"; fi
  done
}
cleanup() {
  local rc=$? p ids n
  trap - EXIT INT TERM
  stop_agents "${PIDS[@]}"
  for p in $(leftovers); do kill -KILL "$p" 2>/dev/null || true; done
  for n in "${NODES[@]}"; do
    ids=$(docker ps -aq --filter "label=io.hostlet.node=$n" 2>/dev/null || true)
    [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  done
  if [ -n "${KEEP_LOGS:-}" ]; then mkdir -p "$KEEP_LOGS" && cp "$WORK"/*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


# Sets P to a loopback port that no socket uses and this run has not handed out yet, below the kernel's
# ephemeral range (an outgoing connection's local port there would make a later bind fail).
EPHEMERAL_LOW=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port() {
  while :; do
    P=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
    [ -z "${USED_PORT[$P]:-}" ] && [ -z "$(ss -Htan "sport = :$P" 2>/dev/null)" ] && break
  done
  USED_PORT[$P]=1
}

ready() { [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:${METRICS[$1]}/readyz" || true)" = 200 ]; }

# launch KEY NODE [FLAGS...]: starts an agent (TLS, its own data dir and ports), not waiting.
launch() {
  local k=$1 node=$2; shift 2
  local peer
  NAME[$k]=$node; DIR[$k]="$WORK/$node"
  port; API[$k]=$P; port; METRICS[$k]=$P; port; CLIENT[$k]=$P; port; peer=$P
  NODES+=("$node")
  "$HOSTLET" run --node-name "$node" --data-dir "${DIR[$k]}" --advertise-address 127.0.0.1 \
    --listen "127.0.0.1:${API[$k]}" --metrics-listen "127.0.0.1:${METRICS[$k]}" \
    --etcd-client-port "${CLIENT[$k]}" --etcd-peer-port "$peer" "$@" >"$WORK/$node.log" 2>&1 &
  PID[$k]=$!; PIDS+=($!)
}
# await_ready KEY T0: sets R to the seconds from T0 until agent KEY's /readyz answers 200, or to "timeout"
# (READY_TIMEOUT s, or the agent exited).
await_ready() {
  local k=$1 t0=$2 deadline=$((SECONDS + READY_TIMEOUT))
  until ready "$k"; do
    if ! kill -0 "${PID[$k]}" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then R=timeout; return; fi
    sleep 0.05
  done
  R=$(python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.3f}')" "$t0")
}
# start KEY NODE [FLAGS...]: launch and wait; R is the seconds to ready (or "timeout").
start() {
  local k=$1 t0; t0=$(now)
  launch "$@"
  await_ready "$k" "$t0"
}
show_log() { echo "--- last lines of $1's log:" >&2; tail -25 "$WORK/$1.log" >&2 || true; }

# TLS client for etcd, with the first voter's client certificate.
tls_args() { local t="${DIR[v1]}/tls"; echo "--cacert $t/ca.crt --cert $t/client.crt --key $t/client.key"; }
ctl() { ETCDCTL_API=3 etcdctl --endpoints "$1" $(tls_args) --command-timeout=10s "${@:2}"; }
voter_eps() { echo "https://127.0.0.1:${CLIENT[v1]},https://127.0.0.1:${CLIENT[v2]},https://127.0.0.1:${CLIENT[v3]}"; }

# The pid of agent KEY's etcd child (empty for a worker).
etcd_of() { pgrep -P "${PID[$1]}" -x etcd | head -1 || true; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# start_voters USES: three voters (v1, then v2 and v3 joining with the server token), all voters before it
# returns; a worker token good for USES joins in WORKER_TOKEN_FILE (0600); SERVER is v1's API URL.
start_voters() {
  local i deadline
  start v1 "$NODE_PREFIX-v1"
  [ "$R" != timeout ] || { show_log "$NODE_PREFIX-v1"; die "voter 1 not ready"; }
  # Voters join with the server token, workers with a worker token, each read from a 0600 file.
  TOKEN_FILE="${DIR[v1]}/token"
  WORKER_TOKEN_FILE="$WORK/worker-token"
  (umask 077; "$HOSTLET" token create --uses "$1" --description "$BENCH-bench" --data-dir "${DIR[v1]}" >"$WORKER_TOKEN_FILE") \
    || die "hostlet token create failed"
  SERVER="https://127.0.0.1:${API[v1]}"
  for i in 2 3; do
    start "v$i" "$NODE_PREFIX-v$i" --server "$SERVER" --token-file "$TOKEN_FILE"
    [ "$R" != timeout ] || { show_log "$NODE_PREFIX-v$i"; die "voter $i not ready"; }
  done
  deadline=$((SECONDS + 120))
  until [ "$(ctl "$(voter_eps)" member list 2>/dev/null | grep -c ', started, .*, false$' || true)" = 3 ]; do
    [ "$SECONDS" -lt "$deadline" ] || { ctl "$(voter_eps)" member list >&2 || true; die "no three voters"; }
    sleep 0.5
  done
}
