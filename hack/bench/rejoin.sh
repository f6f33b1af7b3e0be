#!/usr/bin/env bash
# How soon an agent acts on a tombstone request, and notices its member was removed by another node
#
# Three agents (debug or release build: PROFILE). Two figures, each the time from the action until the agent
# logs that its member must rejoin: (1) a put of /hostlet/hosts/<node>/requests/tombstone; (2) after it has
# rejoined, `etcdctl member remove` of its new member from another node. Targets: 1 s and 5 s. Medians of
# RUNS (3). Nothing is asserted; the last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
NODE_PREFIX=rejoin
source hack/bench-lib.sh
build_hostlet
RUNS="${RUNS:-3}"
WORK="$(mktemp -d /tmp/hostlet-bench-rejoin.XXXXXX)"
PIDS=()
trap cleanup_agents EXIT

ctl() { ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:${CLIENT[1]}" "$@"; }
rejoins() { grep -c "this member must rejoin" "$WORK/agent-3.log" || true; }
# Seconds from now until agent 3 has logged one more "must rejoin" than $1.
time_to_rejoin() {
  local before=$1 t0 deadline=$((SECONDS + 60))
  t0=$(date +%s.%N)
  until [ "$(rejoins)" -gt "$before" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "agent 3 did not rejoin; log:" >&2; tail -20 "$WORK/agent-3.log" >&2; exit 1; }
    sleep 0.02
  done
  python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$t0"
}
# The member id node 3's record names (hex).
member_of_3() { ctl get /hostlet/nodes/rejoin-3 --print-value-only | jq -r '.memberId // empty'; }

start_three

requests=(); removals=()
for run in $(seq 1 "$RUNS"); do
  n=$(rejoins)
  # Stand-by agents settle first: the measure is of an idle agent noticing.
  sleep 5
  t0=$(date +%s.%N)
  ctl put /hostlet/hosts/rejoin-3/requests/tombstone "bench $run" >/dev/null
  requests+=("$(time_to_rejoin "$n")")
  wait_ready 3
  n=$(rejoins)
  sleep 5
  id=$(member_of_3)
  [ -n "$id" ] || { echo "no member of rejoin-3" >&2; exit 1; }
  until ctl member remove "$id" >/dev/null 2>&1; do sleep 0.2; done
  removals+=("$(time_to_rejoin "$n")")
  wait_ready 3
done

python3 - "${requests[*]}" "${removals[*]}" <<'PY'
import json, statistics, sys
req = [float(x) for x in sys.argv[1].split()]
rem = [float(x) for x in sys.argv[2].split()]
r, m = statistics.median(req), statistics.median(rem)
print(f"tombstone request put → acted on: median {r:.2f} s, max {max(req):.2f} s of {len(req)} (target 1 s; ratio {r / 1:.2f})")
print(f"member removed elsewhere → noticed: median {m:.2f} s, max {max(rem):.2f} s of {len(rem)} (target 5 s; ratio {m / 5:.2f})")
print(json.dumps({"bench": "rejoin", "request_s": round(r, 2), "request_max_s": round(max(req), 2),
                  "removal_s": round(m, 2), "removal_max_s": round(max(rem), 2),
                  "request_ratio_to_target": round(r / 1, 2), "removal_ratio_to_target": round(m / 5, 2)}))
PY
