#!/usr/bin/env bash
# 3 voters + 20 workers: join→ready, idle etcd requests and RSS per worker, etcd CPU; one host at 0/50/200 pods
#
# Part 1, a cluster on loopback (TLS, as deployed): 3 voters started one after another, an idle window with
# only them (the baseline), then WORKERS (20) agents joined one after another (the voter target is 3, so each
# becomes a worker: db/worker in its data dir, no etcd child), each timed from its process start to /readyz
# 200; then the same idle window with all of them. Figures: join→ready p50 and max; etcd requests per worker
# per minute, ((with workers) - (voters only)) / WORKERS, from etcd's own grpc_server_handled_total summed
# over the 3 members (target 3); each worker agent's VmRSS, median and max (target 30 MB); the 3 etcd
# processes' CPU and the 3 voter agents' CPU over the window, as % of one core; each voter agent's VmRSS; etcd's watchers (etcd_debugging_mvcc_watcher_total, the 3
# members) in each window (target: no more with the workers), and once more after the workers stopped; a pod
# key put → seen by a worker's pod informer (through a voter's node API), p50/p99 over PROBE_ROUNDS (200)
# puts spread over the first PROBE_WORKERS (10) workers, against a direct etcd watch of the same puts in the
# same run (target: ≤ 1.2 × direct + 5 ms; the probe is runtime/examples/watch_probe.rs, and each of those
# workers runs one busybox pod from then on). The cluster is stopped before part 2.
# Part 2, one more single-node cluster (one agent, its own etcd): for each count in PODS (cumulative), that
# many busybox `sleep 3600` pods applied, all Running and ready, etcd's revision quiet for SETTLE_QUIET_S,
# then the agent's RSS and its CPU over an idle window; the RSS ratio of the largest count to the one before
# it (200 vs 50: target 2).
#
# Environment: WORKERS (20), PODS ("0 50 200", ascending), IDLE_SECONDS (60, each idle window; the voters'
# periodic checks come in bursts every 20 s, so shorter windows, or ones not a multiple of 20 s, are noisy),
# SETTLE_S (5) then SETTLE_MAX (120): before an idle window, at least SETTLE_S s and until two 5 s samples in
# a row saw at most 1 etcd request per agent per second (joins and promotions over); SETTLE_QUIET_S (3);
# READY_TIMEOUT (120); PROBE_WORKERS (10); PROBE_ROUNDS (200); PROFILE; KEEP_LOGS=DIR keeps the agents' logs there.
# Needs the Docker engine, busybox:latest (hack/images.sh) and /usr/bin/etcd. Every agent, etcd, container
# and data dir is removed on exit. Nothing is asserted; the last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
NODE_PREFIX="scale$$"
source hack/bench-lib.sh

WORKERS="${WORKERS:-20}"
PODS="${PODS:-0 50 200}"
IDLE_SECONDS="${IDLE_SECONDS:-60}"
SETTLE_S="${SETTLE_S:-5}"
SETTLE_MAX="${SETTLE_MAX:-120}"
SETTLE_QUIET_S="${SETTLE_QUIET_S:-3}"
READY_TIMEOUT="${READY_TIMEOUT:-120}"
PROBE_WORKERS="${PROBE_WORKERS:-10}"
PROBE_ROUNDS="${PROBE_ROUNDS:-200}"
VOTERS=3

BENCH=scale
source hack/bench-cluster.sh

# Sum of grpc_server_handled_total over the voters' members, by method: "method count" lines; and the sum of
# grpc_server_msg_received_total as "(messages) count" (handled_total counts a stream, a watch or a lease
# keep-alive, once, when it ends; the messages count what flows in streams too).
scrape() {
  local t="${DIR[v1]}/tls" k
  for k in v1 v2 v3; do
    curl -s -m 5 --cacert "$t/ca.crt" --cert "$t/client.crt" --key "$t/client.key" "https://127.0.0.1:${CLIENT[$k]}/metrics"
  done | awk '/^grpc_server_handled_total\{/ {
      match($0, /grpc_method="[^"]*"/); m = substr($0, RSTART + 13, RLENGTH - 14); sum[m] += $NF
    }
    /^grpc_server_msg_received_total\{/ { msgs += $NF }
    /^etcd_debugging_mvcc_watcher_total / { watchers += $NF }
    END { for (m in sum) print m, sum[m]; print "(messages)", msgs + 0; print "(watchers)", watchers + 0 }'
}

total_requests() { scrape | awk '$1 !~ /^\(/ { s += $2 } END { printf "%d\n", s }'; }
# settle AGENTS: until joins and promotions are over: at least SETTLE_S s, then until two 5 s samples in a
# row each saw at most one etcd request per agent per second (at most SETTLE_MAX s; then it says so).
settle() {
  local agents=$1 start=$SECONDS calm=0 a b
  sleep "$SETTLE_S"
  a=$(total_requests)
  while [ "$calm" -lt 2 ]; do
    if [ $((SECONDS - start)) -ge "$SETTLE_MAX" ]; then
      echo "warning: still more than 1 etcd request per agent per second after ${SETTLE_MAX} s; measuring anyway" >&2
      break
    fi
    sleep 5
    b=$(total_requests)
    if [ $((b - a)) -le $((agents * 5)) ]; then calm=$((calm + 1)); else calm=0; fi
    a=$b
  done
  echo "settled after $((SECONDS - start)) s" >&2
}
# window NAME: an idle window of IDLE_SECONDS over the cluster: requests by method before/after
# ($WORK/NAME.before/.after), and "t0 t1 etcd_ticks0 etcd_ticks1" in $WORK/NAME.win.
window() {
  local name=$1 e t0 t1 k0=0 k1=0 a0=0 a1=0 pids=()
  for k in v1 v2 v3; do e=$(etcd_of "$k"); [ -n "$e" ] || die "no etcd child under voter $k"; pids+=("$e"); done
  scrape >"$WORK/$name.before"
  for e in "${pids[@]}"; do k0=$((k0 + $(ticks "$e"))); done
  for k in v1 v2 v3; do a0=$((a0 + $(ticks "${PID[$k]}"))); done
  t0=$(now)
  sleep "$IDLE_SECONDS"
  t1=$(now)
  for e in "${pids[@]}"; do k1=$((k1 + $(ticks "$e"))); done
  for k in v1 v2 v3; do a1=$((a1 + $(ticks "${PID[$k]}"))); done
  echo "$a0 $a1" >"$WORK/$name.agents"
  scrape >"$WORK/$name.after"
  for k in v1 v2 v3; do [ "$(etcd_of "$k")" != "" ] || echo "warning: voter $k's etcd went away during $name" >&2; done
  echo "$t0 $t1 $k0 $k1" >"$WORK/$name.win"
}

command -v etcd >/dev/null || die "etcd not found"
docker image inspect busybox:latest >/dev/null 2>&1 || bash hack/images.sh >/dev/null
build_hostlet
if [ "$PROFILE" = release ]; then cargo build --release --quiet -p hostlet-runtime --example watch_probe
else cargo build --quiet -p hostlet-runtime --example watch_probe; fi

# ---- Part 1: 3 voters, then WORKERS workers ----
echo "3 voters, then $WORKERS workers (nodes $NODE_PREFIX-*, data in $WORK)" >&2
start_voters "$((WORKERS + 1))"
echo "3 voters up; settling, then ${IDLE_SECONDS} s idle with the voters only" >&2
settle 3
window base

join_times=()
not_ready=()
for i in $(seq 1 "$WORKERS"); do
  start "w$i" "$NODE_PREFIX-w$i" --server "$SERVER" --token-file "$WORKER_TOKEN_FILE"
  if [ "$R" = timeout ]; then
    echo "warning: worker $i not ready after ${READY_TIMEOUT} s (or exited)" >&2; show_log "$NODE_PREFIX-w$i"
    not_ready+=("$i")
  else
    join_times+=("$R")
  fi
done
# Each worker: db/worker in its data dir and no etcd child.
confirmed=0
for i in $(seq 1 "$WORKERS"); do
  if [ -f "${DIR[w$i]}/db/worker" ] && [ -z "$(etcd_of "w$i")" ]; then
    confirmed=$((confirmed + 1))
  else
    echo "warning: worker $i is not a worker (db/worker: $([ -f "${DIR[w$i]}/db/worker" ] && echo yes || echo no), etcd child: $(etcd_of "w$i"))" >&2
  fi
done
members=$(ctl "$(voter_eps)" member list 2>/dev/null | wc -l || true)
echo "$WORKERS workers started ($confirmed confirmed workers; etcd has $members members); settling, then ${IDLE_SECONDS} s idle" >&2
settle $((VOTERS + WORKERS))
window full
worker_rss=()
for i in $(seq 1 "$WORKERS"); do
  kill -0 "${PID[w$i]}" 2>/dev/null && worker_rss+=("$(rss_kb "${PID[w$i]}")")
done
voter_rss=()
for k in v1 v2 v3; do voter_rss+=("$(rss_kb "${PID[$k]}")"); done

# Problems the agents logged (errors and warnings), before the cluster goes.
log_problems=0
for n in "${NODES[@]}"; do
  c=$(grep -c -E '\b(ERROR|WARN)\b' "$WORK/$n.log" || true); log_problems=$((log_problems + c))
  if [ "$c" -gt 0 ]; then echo "--- $n: $c error/warning lines, first 5:" >&2; grep -E '\b(ERROR|WARN)\b' "$WORK/$n.log" | head -5 >&2; fi
done

# A pod key put → seen by the worker's pod informer (through a voter's node API), against a direct etcd
# watch of the same keys in the same run: PROBE_ROUNDS puts over the first PROBE_WORKERS workers.
probe_targets=()
for i in $(seq 1 "$(( WORKERS < PROBE_WORKERS ? WORKERS : PROBE_WORKERS ))"); do
  kill -0 "${PID[w$i]}" 2>/dev/null && probe_targets+=("/hostlet/hosts/${NAME[w$i]}/pods/probe=127.0.0.1:${METRICS[w$i]}")
done
if [ "${#probe_targets[@]}" -gt 0 ]; then
  echo "probing pod key put → worker informer: $PROBE_ROUNDS puts over ${#probe_targets[@]} workers" >&2
  t="${DIR[v1]}/tls"
  "$TARGET/$PROFILE/examples/watch_probe" --endpoints "$(voter_eps)" --ca "$t/ca.crt" --cert "$t/client.crt" \
    --key "$t/client.key" --rounds "$PROBE_ROUNDS" "${probe_targets[@]}" >"$WORK/probe.out" || echo "warning: the probe failed" >&2
  grep -v '^{' "$WORK/probe.out" >&2 || true
fi
tail -1 "$WORK/probe.out" 2>/dev/null | grep '^{' >"$WORK/probe.json" || echo '{}' >"$WORK/probe.json"

# etcd's watchers once the workers are gone, the voters still up: the same as with them when the voters
# serve the workers' watches from their own.
echo "stopping the workers" >&2
worker_pids=()
for i in $(seq 1 "$WORKERS"); do worker_pids+=("${PID[w$i]}"); done
stop_agents "${worker_pids[@]}"
settle 3
scrape >"$WORK/stopped.after"

echo "stopping the voters" >&2
stop_agents "${PID[v1]}" "${PID[v2]}" "${PID[v3]}"
# An agent stops its etcd: one left running would be a bug, and would cost CPU in part 2.
left=$(leftovers)
if [ -n "$left" ]; then
  echo "warning: processes left running after the agents stopped:" >&2
  for p in $left; do ps -o pid=,args= -p "$p" | cut -c1-160 >&2 || true; kill -KILL "$p" 2>/dev/null || true; done
fi

# ---- Part 2: one host, 0/50/200 pods ----
start p "$NODE_PREFIX-pods"
[ "$R" != timeout ] || { show_log "$NODE_PREFIX-pods"; die "pod host not ready"; }
PNODE="$NODE_PREFIX-pods"
pctl() { local t="${DIR[p]}/tls"; ETCDCTL_API=3 etcdctl --endpoints "https://127.0.0.1:${CLIENT[p]}" \
  --cacert "$t/ca.crt" --cert "$t/client.crt" --key "$t/client.key" --command-timeout=10s "$@"; }
revision() { pctl endpoint status -w json 2>/dev/null | jq -r '.[0].Status.header.revision' || echo 0; }
# Pods of this node Running with all containers ready, per `hostlet pod ls`.
running_pods() {
  "$HOSTLET" pod ls --data-dir "${DIR[p]}" 2>/dev/null | awk 'NR > 1 && $3 == "Running" { split($4, r, "/"); if (r[1] == r[2] && r[2] > 0) n++ } END { print n + 0 }'
}
pod_rows=()
applied=0
for n in $PODS; do
  [ "$n" -ge "$applied" ] || die "PODS must be ascending"
  t0=$(now)
  if [ "$n" -gt "$applied" ]; then
    f="$WORK/pods-$n.yaml"; : >"$f"
    for j in $(seq $((applied + 1)) "$n"); do
      printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: sleep-%03d}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, "3600"]\n' "$j" >>"$f"
    done
    "$HOSTLET" pod apply -f "$f" --data-dir "${DIR[p]}" >/dev/null || die "pod apply failed"
    applied=$n
  fi
  deadline=$((SECONDS + 300))
  until [ "$(running_pods)" -ge "$n" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { "$HOSTLET" pod ls --data-dir "${DIR[p]}" | grep -v Running | head >&2; show_log "$PNODE"; die "$n pods not running after 300 s"; }
    sleep 1
  done
  up_s=$(python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
  docker_running=$(docker ps -q --filter "label=io.hostlet.node=$PNODE" --filter status=running | wc -l)
  # Settled: etcd's revision (status writes, events) unchanged for SETTLE_QUIET_S, at most 60 s.
  quiet_deadline=$((SECONDS + 60)); last=$(revision); since=$(now); settled=no
  while [ "$SECONDS" -lt "$quiet_deadline" ]; do
    sleep 0.5
    cur=$(revision)
    if [ "$cur" != "$last" ]; then last=$cur; since=$(now);
    elif python3 -c "import sys,time; sys.exit(0 if time.time() - float(sys.argv[1]) >= float(sys.argv[2]) else 1)" "$since" "$SETTLE_QUIET_S"; then settled=yes; break; fi
  done
  [ "$settled" = yes ] || echo "warning: $n pods: etcd revision still moving after 60 s" >&2
  apid=${PID[p]}; epid=$(etcd_of p)
  rev0=$(revision); a0=$(ticks "$apid"); e0=$(ticks "$epid"); w0=$(now)
  sleep "$IDLE_SECONDS"
  w1=$(now); a1=$(ticks "$apid"); e1=$(ticks "$epid"); rev1=$(revision)
  pod_rows+=("$n $(rss_kb "$apid") $w0 $w1 $a0 $a1 $e0 $e1 $rev0 $rev1 $up_s $docker_running $(running_pods)")
  echo "$n pods: running after ${up_s} s ($docker_running containers running); measured ${IDLE_SECONDS} s idle" >&2
done
c=$(grep -c -E '\b(ERROR|WARN)\b' "$WORK/$PNODE.log" || true); log_problems=$((log_problems + c))
if [ "$c" -gt 0 ]; then echo "--- $PNODE: $c error/warning lines, first 5:" >&2; grep -E '\b(ERROR|WARN)\b' "$WORK/$PNODE.log" | head -5 >&2; fi

python3 - "$WORK" "$WORKERS" "$(getconf CLK_TCK)" "${join_times[*]:-}" "${not_ready[*]:-}" "$confirmed" \
  "${worker_rss[*]:-}" "${voter_rss[*]}" "$log_problems" "$(printf '%s;' "${pod_rows[@]}")" <<'PY'
import json, statistics, sys
work, workers, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
joins = [float(x) for x in sys.argv[4].split()]
not_ready = sys.argv[5].split()
confirmed = int(sys.argv[6])
wrss = [int(x) / 1024 for x in sys.argv[7].split()]
vrss = [int(x) / 1024 for x in sys.argv[8].split()]
log_problems = int(sys.argv[9])
rows = [r.split() for r in sys.argv[10].split(";") if r.strip()]

def read(p):
    d = {}
    for line in open(p):
        m, v = line.split()
        d[m] = float(v)
    return d

def win(name):
    before, after = read(f"{work}/{name}.before"), read(f"{work}/{name}.after")
    t0, t1, k0, k1 = map(float, open(f"{work}/{name}.win").read().split())
    minutes = (t1 - t0) / 60
    watchers = after.pop("(watchers)", 0)
    before.pop("(watchers)", None)
    per = {m: (after.get(m, 0) - before.get(m, 0)) / minutes for m in set(after) | set(before)}
    msgs = per.pop("(messages)", 0)
    return per, sum(per.values()), (k1 - k0) / hz / (t1 - t0) * 100, t1 - t0, msgs, watchers

base, base_total, base_cpu, base_s, base_msgs, base_watchers = win("base")

def agents_cpu(name):
    """The 3 voter agents' CPU over the window, % of one core."""
    a0, a1 = map(float, open(f"{work}/{name}.agents").read().split())
    t0, t1, _, _ = map(float, open(f"{work}/{name}.win").read().split())
    return (a1 - a0) / hz / (t1 - t0) * 100
stopped_watchers = read(f"{work}/stopped.after").get("(watchers)")
probe = json.load(open(f"{work}/probe.json"))
full, full_total, full_cpu, full_s, full_msgs, full_watchers = win("full")
per_worker = (full_total - base_total) / workers if workers else 0.0
msgs_per_worker = (full_msgs - base_msgs) / workers if workers else 0.0
# Requests: at most half a kubelet's lease renewals (the node-trust issue; 6.5 before workers went through
# the voters' node API).
rpc_target, rss_target, ratio_target = 3, 30, 2

def fmt(x, n=2):
    return None if x is None else round(x, n)

print(f"scale: {3} voters + {workers} workers on {len(open('/proc/cpuinfo').read().split('processor')) - 1} cores")
if joins:
    p50, mx = statistics.median(joins), max(joins)
    print(f"worker join → ready (process start to /readyz 200): p50 {p50:.2f} s, max {mx:.2f} s, "
          f"min {min(joins):.2f} s ({len(joins)} of {workers} ready; {confirmed} with db/worker and no etcd)")
else:
    p50 = mx = None
    print(f"worker join → ready: none of {workers} ready")
if not_ready:
    print(f"  not ready within the timeout: workers {' '.join(not_ready)}")
print(f"etcd requests per minute, all 3 members: voters only {base_total:.1f} ({base_s:.0f} s), "
      f"with {workers} workers {full_total:.1f} ({full_s:.0f} s)")
for m in sorted(set(base) | set(full), key=lambda m: -(full.get(m, 0) - base.get(m, 0))):
    d = (full.get(m, 0) - base.get(m, 0)) / workers if workers else 0
    if full.get(m, 0) or base.get(m, 0):
        print(f"  {m:<24} {base.get(m, 0):8.1f} → {full.get(m, 0):8.1f}   per worker {d:7.2f}")
if full_s < 60:
    print("  note: idle windows under 60 s are noisy: the voters' periodic checks come in bursts every 20 s")
print(f"etcd requests per worker per idle minute: {per_worker:.2f}   (target ≤ {rpc_target}; ratio {per_worker / rpc_target:.2f})")
print(f"etcd watchers on the voters (etcd_debugging_mvcc_watcher_total, 3 members): voters only {base_watchers:.0f}, "
      f"with {workers} workers {full_watchers:.0f} ({(full_watchers - base_watchers) / max(workers, 1):.1f} per worker; target 0), "
      f"after the workers stopped {stopped_watchers:.0f}")
print(f"  gRPC messages received (grpc_server_msg_received_total, stream messages too) per worker per minute: {msgs_per_worker:.2f}"
      f"   (voters only {base_msgs:.1f}/min, with workers {full_msgs:.1f}/min, all 3 members)")
if probe.get("rounds"):
    print(f"pod key put → seen ({probe['rounds']} puts, {probe['lost']} not measured): direct etcd watch p50 {probe['direct_p50_ms']} ms, "
          f"p99 {probe['direct_p99_ms']} ms; worker's pod informer p50 {probe['informer_p50_ms']} ms, p99 {probe['informer_p99_ms']} ms "
          f"(target ≤ 1.2 × direct + 5 ms; ratio {probe['p50_to_target']} p50, {probe['p99_to_target']} p99)")
else:
    print("pod key put → seen: not measured (no worker, or the probe failed)")
if wrss:
    rm, rx = statistics.median(wrss), max(wrss)
    print(f"worker agent RSS: median {rm:.1f} MB, max {rx:.1f} MB   (target ≤ {rss_target} MB; ratio {rm / rss_target:.2f} median, {rx / rss_target:.2f} max)")
else:
    rm = rx = None
print(f"voter agent RSS: {', '.join(f'{v:.1f}' for v in vrss)} MB")
print(f"etcd CPU, 3 processes together: {full_cpu:.2f} % of one core with the workers, {base_cpu:.2f} % with the voters only")
print(f"voter agents' CPU, 3 together: {agents_cpu('full'):.2f} % of one core with the workers, {agents_cpu('base'):.2f} % with the voters only")

pods = {}
for r in rows:
    n, rss, w0, w1, a0, a1, e0, e1, rev0, rev1, up, dock, run = r
    secs = float(w1) - float(w0)
    pods[int(n)] = {
        "rss_mb": int(rss) / 1024,
        "cpu_pct": (float(a1) - float(a0)) / hz / secs * 100,
        "etcd_cpu_pct": (float(e1) - float(e0)) / hz / secs * 100,
        "writes_per_min": (int(rev1) - int(rev0)) / secs * 60,
        "up_s": float(up), "containers": int(dock), "running": int(run),
    }
print(f"pod host (one agent, its own etcd), {rows and (float(rows[0][3]) - float(rows[0][2])) or 0:.0f} s idle each:")
for n, p in sorted(pods.items()):
    print(f"  {n:4d} pods: agent RSS {p['rss_mb']:6.1f} MB, agent CPU {p['cpu_pct']:5.2f} % of a core, "
          f"etcd CPU {p['etcd_cpu_pct']:5.2f} %, etcd writes {p['writes_per_min']:5.1f}/min "
          f"({p['running']} running, {p['containers']} containers; all running {p['up_s']:.1f} s after apply)")
counts = sorted(pods)
ratio = None
if len(counts) >= 2 and pods[counts[-2]]["rss_mb"] > 0:
    hi, lo = counts[-1], counts[-2]
    ratio = pods[hi]["rss_mb"] / pods[lo]["rss_mb"]
    print(f"agent RSS@{hi} / RSS@{lo}: {ratio:.2f}   (target ≤ {ratio_target}; ratio {ratio / ratio_target:.2f})")
print(f"agents' logs: {log_problems} error/warning lines")
print(json.dumps({
    "bench": "scale",
    "voters": 3,
    "workers": workers,
    "workers_ready": len(joins),
    "workers_confirmed": confirmed,
    "join_ready_p50_s": fmt(p50),
    "join_ready_max_s": fmt(mx),
    "idle_s": round(full_s),
    "rpc_min_voters_only": fmt(base_total, 1),
    "rpc_min_with_workers": fmt(full_total, 1),
    "rpc_per_worker_min": fmt(per_worker),
    "rpc_per_worker_ratio_to_target": fmt(per_worker / rpc_target),
    "grpc_msgs_per_worker_min": fmt(msgs_per_worker),
    "etcd_watchers_voters_only": base_watchers,
    "etcd_watchers_with_workers": full_watchers,
    "etcd_watchers_workers_stopped": stopped_watchers,
    "pod_put_direct_watch_p50_ms": probe.get("direct_p50_ms"),
    "pod_put_direct_watch_p99_ms": probe.get("direct_p99_ms"),
    "pod_put_worker_informer_p50_ms": probe.get("informer_p50_ms"),
    "pod_put_worker_informer_p99_ms": probe.get("informer_p99_ms"),
    "pod_put_informer_to_target_p50": probe.get("p50_to_target"),
    "pod_put_informer_to_target_p99": probe.get("p99_to_target"),
    "worker_rss_median_mb": fmt(rm, 1),
    "worker_rss_max_mb": fmt(rx, 1),
    "worker_rss_median_ratio_to_target": fmt(rm / rss_target if rm else None),
    "worker_rss_max_ratio_to_target": fmt(rx / rss_target if rx else None),
    "etcd_cpu_pct": fmt(full_cpu),
    "etcd_cpu_pct_voters_only": fmt(base_cpu),
    "voter_agents_cpu_pct": fmt(agents_cpu("full")),
    "voter_agents_cpu_pct_voters_only": fmt(agents_cpu("base")),
    "voter_agents_rss_mb": [round(v, 1) for v in vrss],
    "pods_rss_mb": {str(n): round(p["rss_mb"], 1) for n, p in sorted(pods.items())},
    "pods_cpu_pct": {str(n): round(p["cpu_pct"], 2) for n, p in sorted(pods.items())},
    "pods_rss_ratio": fmt(ratio),
    "pods_rss_ratio_to_target": fmt(ratio / ratio_target if ratio else None),
    "log_problems": log_problems,
}))
PY
