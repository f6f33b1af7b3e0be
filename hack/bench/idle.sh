#!/usr/bin/env bash
# A cluster doing nothing: 3 agents, all voters, no pods, IDLE_S (60) s idle; etcd requests per agent per minute.
# The figures come from etcd's own grpc_server_handled_total on each member's /metrics (every gRPC request
# the agents make, by method), read after the cluster settled and again IDLE_S seconds later; plus the
# agents' CPU (user+system over the idle time) and resident memory. The baseline is the target of
# 30 requests per agent per minute (692 before the shared caches). Nothing is asserted; the last line is
# one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
NODE_PREFIX=idle
source hack/bench-lib.sh
build_hostlet
IDLE_S="${IDLE_S:-60}"
SETTLE_S="${SETTLE_S:-15}"
WORK="$(mktemp -d /tmp/hostlet-bench-idle.XXXXXX)"
PIDS=()
trap cleanup_agents EXIT

start_three
deadline=$((SECONDS + 120))
until [ "$(ETCDCTL_API=3 etcdctl --endpoints "$EPS" member list 2>/dev/null | grep -c ', started, .*, false$' || true)" = 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "no three voters" >&2; exit 1; }
  sleep 0.5
done
# Joins, promotions and first syncs are over before the idle minute starts.
sleep "$SETTLE_S"

# Sums grpc_server_handled_total by method over the three members, as "method count" lines.
scrape() {
  for i in 1 2 3; do curl -s "http://127.0.0.1:${CLIENT[$i]}/metrics"; done |
    awk '/^grpc_server_handled_total\{/ {
      match($0, /grpc_method="[^"]*"/); m = substr($0, RSTART + 13, RLENGTH - 14); sum[m] += $NF
    } END { for (m in sum) print m, sum[m] }'
}
cpu_ticks() {
  local t=0
  for p in "${PIDS[@]}"; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}
scrape >"$WORK/before"
ticks0=$(cpu_ticks)
t0=$(date +%s.%N)
sleep "$IDLE_S"
t1=$(date +%s.%N)
ticks1=$(cpu_ticks)
scrape >"$WORK/after"
rss_kb=0
for p in "${PIDS[@]}"; do
  r=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status"); [ "$r" -gt "$rss_kb" ] && rss_kb=$r
done

python3 - "$WORK/before" "$WORK/after" "$t0" "$t1" "$ticks0" "$ticks1" "$(getconf CLK_TCK)" "$rss_kb" <<'PY'
import json, sys
def read(p):
    d = {}
    for line in open(p):
        m, v = line.split()
        d[m] = float(v)
    return d
before, after = read(sys.argv[1]), read(sys.argv[2])
t0, t1, k0, k1, hz, rss_kb = map(float, sys.argv[3:9])
minutes = (t1 - t0) / 60
per = {m: (after.get(m, 0) - before.get(m, 0)) / 3 / minutes for m in after}
per = {m: v for m, v in per.items() if v > 0}
total = sum(per.values())
cpu_pct = (k1 - k0) / hz / (t1 - t0) / 3 * 100
target = 30
print(f"idle {t1 - t0:.0f} s, 3 voters, no pods: etcd requests per agent per minute, by method")
for m, v in sorted(per.items(), key=lambda kv: -kv[1]):
    print(f"  {m:<24} {v:8.1f}")
print(f"  {'total':<24} {total:8.1f}   (target {target}; ratio to target {total / target:.2f}; 692 before the shared caches)")
print(f"agent CPU {cpu_pct:.2f} % of a core each (mean of 3); largest agent RSS {rss_kb / 1024:.1f} MB")
print(json.dumps({
    "bench": "idle",
    "rpc_per_agent_min": round(total, 1),
    "member_list_per_agent_min": round(per.get("MemberList", 0), 1),
    "status_per_agent_min": round(per.get("Status", 0), 1),
    "range_per_agent_min": round(per.get("Range", 0), 1),
    "cpu_pct": round(cpu_pct, 2),
    "rss_mb": round(rss_kb / 1024, 1),
    "ratio_to_target": round(total / target, 2),
}))
PY
