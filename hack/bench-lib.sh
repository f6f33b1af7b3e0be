# Shared by the benchmark scripts in hack/bench/ (sourced, not run): the hostlet binary, loopback ports, agents.
#   PROFILE=release|debug   which build of hostlet (release by default; built here if stale)
#   KEEP_LOGS=DIR           the agents' logs are copied there before WORK goes
# A script sets WORK and PIDS before it starts agents; cleanup_agents stops them.

TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
PROFILE="${PROFILE:-release}"

# Builds hostlet (release or debug, as PROFILE says) and sets HOSTLET to it.
build_hostlet() {
  if [ "$PROFILE" = release ]; then cargo build --release --quiet --bin hostlet; else cargo build --quiet --bin hostlet; fi
  HOSTLET="$TARGET/$PROFILE/hostlet"
}

# A loopback port nobody listens on, below the kernel's ephemeral range: outgoing connections take their
# local ports from there, so one picked from it can be in use by the time an agent binds it.
free_port() {
  local p low
  low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  while :; do
    p=$((10000 + RANDOM % (low - 10000)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}

now() { date +%s.%N; }
# elapsed T0 T1: seconds from T0 to T1 (as now prints them), to the ms. larger A B: the larger number.
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
larger() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > a) ? b : a }'; }

# Agents on loopback, each with its own etcd member, ports (the CLIENT, METRICS and API arrays, by index)
# and data dir $WORK/n<i>; their logs in $WORK/agent-<i>.log. NODE_PREFIX names them (<prefix>-<i>).
NODE_PREFIX="${NODE_PREFIX:-bench}"

# start_agent I [FLAGS...]: starts agent I and waits until it is ready.
start_agent() {
  local i=$1; shift
  CLIENT[$i]=$(free_port); METRICS[$i]=$(free_port); API[$i]=$(free_port)
  local peer; peer=$(free_port)
  "$HOSTLET" run --data-dir "$WORK/n$i" --node-name "$NODE_PREFIX-$i" --advertise-address 127.0.0.1 --etcd-insecure \
    --etcd-client-port "${CLIENT[$i]}" --etcd-peer-port "$peer" --listen "127.0.0.1:${API[$i]}" \
    --metrics-listen "127.0.0.1:${METRICS[$i]}" "$@" >"$WORK/agent-$i.log" 2>&1 &
  PIDS+=($!)
  wait_ready "$i"
}

# wait_ready I: until agent I's /readyz answers 200 (at most 120 s; then its log and a failure).
wait_ready() {
  local deadline=$((SECONDS + 120))
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${METRICS[$1]}/readyz" || true)" = 200 ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "agent $1 not ready; log:" >&2; tail -20 "$WORK/agent-$1.log" >&2; exit 1; }
    sleep 0.1
  done
}

# start_three [FLAGS...]: agent 1, then 2 and 3 joining it; EPS is their client URLs.
start_three() {
  start_agent 1 "$@"
  start_agent 2 --server "http://127.0.0.1:${API[1]}" --token-file "$WORK/n1/token" "$@"
  start_agent 3 --server "http://127.0.0.1:${API[1]}" --token-file "$WORK/n1/token" "$@"
  EPS="http://127.0.0.1:${CLIENT[1]},http://127.0.0.1:${CLIENT[2]},http://127.0.0.1:${CLIENT[3]}"
}

# Stops every agent in PIDS and removes WORK.
cleanup_agents() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "${KEEP_LOGS:-}" ]; then mkdir -p "$KEEP_LOGS" && cp "$WORK"/agent-*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$WORK"
}

# start_probe ENDPOINTS OUT: a writer putting every 50 ms in the background (PROBE is its pid); each line of
# OUT: start end ok. stop_probe ends it; longest_stall OUT prints the longest put and the failed count.
PROBE=""
start_probe() {
  local eps=$1 out=$2
  (
    while :; do
      t0=$(now)
      if ETCDCTL_API=3 etcdctl --endpoints "$eps" --command-timeout=60s put /bench-probe x >/dev/null 2>&1; then ok=1; else ok=0; fi
      echo "$t0 $(now) $ok"
      sleep 0.05
    done
  ) >"$out" &
  PROBE=$!
}
stop_probe() { kill "$PROBE" 2>/dev/null || true; wait "$PROBE" 2>/dev/null || true; PROBE=""; }
longest_stall() { awk 'BEGIN{m=0} {d=$2-$1; if ($3==0) f++; if (d>m) m=d} END{printf "%.3f %d\n", m, f}' "$1"; }
