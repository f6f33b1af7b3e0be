#!/usr/bin/env bash
# Rolling etcd 3.4.23 -> 3.5.1 on 3 members: hostlet's upgrade controller against the same restarts by hand.
# Baseline: a bare 3-member etcd 3.4 cluster on loopback, rolled by hand the way docs/guide.md says: a
# snapshot, then per member (followers first, the leader last) stop, swap the binary, start, wait until
# /health is true, next (the binary swapped once, after the snapshot). hostlet: three agents on 3.4, each with its own binary path, the binaries replaced
# at the same moment; the agents roll by themselves (default flags). Both clusters first get DB_MB MB of data
# (1 MB values; 100 by default), so that snapshots and restarts do real work. Figures: the total
# (baseline: first step to last member healthy, snapshot included; hostlet: from the swap to the last
# EtcdUpgraded event), each member's longest time not serving, and a writer's longest stall (a put every
# 50 ms). Needs etcd 3.5.1 (ETCD35_DIR, hack/install-deps.sh --tests). Nothing is asserted; the last line
# is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/bench-lib.sh
build_hostlet
ETCD35_DIR="${ETCD35_DIR:-/opt/hostlet-test/etcd-3.5.1}"
DB_MB="${DB_MB:-100}"
"$ETCD35_DIR/etcd" --version | grep -q "etcd Version: 3.5" || { echo "no etcd 3.5 in $ETCD35_DIR (hack/install-deps.sh --tests)" >&2; exit 1; }
ETCD34="$(command -v etcd)"
WORK="$(mktemp -d /tmp/hostlet-bench-upgrade.XXXXXX)"
PIDS=()
ETCD_PIDS=()
cleanup() {
  [ -n "$PROBE" ] && kill "$PROBE" 2>/dev/null || true
  for p in "${ETCD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${ETCD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  cleanup_agents
}
trap cleanup EXIT

# Puts the etcd tools of directory $1 into directory $2, each by a rename over the old file (as dpkg does).
install_tools() {
  mkdir -p "$2"
  for t in etcd etcdctl etcdutl; do
    [ -e "$1/$t" ] || continue
    cp "$1/$t" "$2/.$t.new" && mv "$2/.$t.new" "$2/$t"
  done
}

# fill ENDPOINTS: DB_MB keys of 1 MB each.
fill() {
  [ -s "$WORK/value" ] || { head -c 786432 /dev/urandom | base64 -w0 | head -c 1000000 >"$WORK/value" || true; }
  for i in $(seq 1 "$DB_MB"); do
    ETCDCTL_API=3 etcdctl --endpoints "$1" --command-timeout=60s put "/fill/$i" <"$WORK/value" >/dev/null
  done
}
healthy() { curl -sf --max-time 1 "$1/health" 2>/dev/null | grep -q '"health":"true"'; }
leader_of() {
  ETCDCTL_API=3 etcdctl --endpoints "$1" endpoint status -w json |
    python3 -c 'import json,sys; s=json.load(sys.stdin); print([e["Endpoint"] for e in s if e["Status"]["leader"]==e["Status"]["header"]["member_id"]][0])'
}

# --- Baseline: a bare etcd cluster rolled by hand.
declare -a BC BP BDIR
cluster=""
for i in 1 2 3; do
  BC[$i]=$(free_port); BP[$i]=$(free_port); BDIR[$i]="$WORK/bare$i"
  cluster+="b$i=http://127.0.0.1:${BP[$i]},"
done
cluster="${cluster%,}"
mkdir -p "$WORK/bin-manual"
install_tools "$(dirname "$ETCD34")" "$WORK/bin-manual"
start_bare() {
  local i=$1 state=$2
  "$WORK/bin-manual/etcd" --name "b$i" --data-dir "${BDIR[$i]}" \
    --listen-client-urls "http://127.0.0.1:${BC[$i]}" --advertise-client-urls "http://127.0.0.1:${BC[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${BP[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${BP[$i]}" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" >>"$WORK/bare$i.log" 2>&1 &
  ETCD_PIDS[$i]=$!
}
for i in 1 2 3; do start_bare "$i" new; done
BEPS="http://127.0.0.1:${BC[1]},http://127.0.0.1:${BC[2]},http://127.0.0.1:${BC[3]}"
deadline=$((SECONDS + 60))
for i in 1 2 3; do
  until healthy "http://127.0.0.1:${BC[$i]}"; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "the bare cluster did not come up" >&2; tail -5 "$WORK"/bare*.log >&2; exit 1; }
    sleep 0.1
  done
done
fill "$BEPS"
LEADER=$(leader_of "$BEPS")
ORDER=()
for i in 1 2 3; do [ "http://127.0.0.1:${BC[$i]}" = "$LEADER" ] || ORDER+=("$i"); done
for i in 1 2 3; do [ "http://127.0.0.1:${BC[$i]}" = "$LEADER" ] && ORDER+=("$i"); done
start_probe "$BEPS" "$WORK/probe-manual"
m_first=$(now)
ETCDCTL_API=3 etcdctl --endpoints "$LEADER" snapshot save "$WORK/manual.db" >/dev/null
m_snap=$(now)
manual_longest=0
# The package upgrade: the running members keep the files they started from.
install_tools "$ETCD35_DIR" "$WORK/bin-manual"
for i in "${ORDER[@]}"; do
  t0=$(now)
  kill -TERM "${ETCD_PIDS[$i]}"; wait "${ETCD_PIDS[$i]}" 2>/dev/null || true
  start_bare "$i" existing
  until healthy "http://127.0.0.1:${BC[$i]}"; do sleep 0.05; done
  t1=$(now)
  d=$(elapsed "$t0" "$t1")
  echo "by hand: member b$i out for $d s" >&2
  manual_longest=$(larger "$manual_longest" "$d")
done
m_last=$(now)
stop_probe
manual_total=$(elapsed "$m_first" "$m_last")
manual_snap=$(elapsed "$m_first" "$m_snap")
read -r manual_stall manual_failed < <(longest_stall "$WORK/probe-manual")
for p in "${ETCD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${ETCD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
ETCD_PIDS=()

# --- hostlet: three agents, each on its own copy of 3.4.
for i in 1 2 3; do install_tools "$(dirname "$ETCD34")" "$WORK/bin$i"; done
start_agent 1 --etcd-binary "$WORK/bin1/etcd" --snapshot-schedule "0 0 1 1 *"
for i in 2 3; do
  start_agent "$i" --server "http://127.0.0.1:${API[1]}" --token-file "$WORK/n1/token" \
    --etcd-binary "$WORK/bin$i/etcd" --snapshot-schedule "0 0 1 1 *"
done
EPS="http://127.0.0.1:${CLIENT[1]},http://127.0.0.1:${CLIENT[2]},http://127.0.0.1:${CLIENT[3]}"
ctl() { ETCDCTL_API=3 etcdctl --endpoints "$EPS" --command-timeout=30s "$@"; }
deadline=$((SECONDS + 120))
until [ "$(ctl member list 2>/dev/null | grep -c ', started, .*, false$' || true)" = 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "no three voters" >&2; exit 1; }
  sleep 0.5
done
fill "$EPS"
start_probe "$EPS" "$WORK/probe-hostlet"
since=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
t_swap=$(now)
for i in 1 2 3; do install_tools "$ETCD35_DIR" "$WORK/bin$i"; done
count_done() {
  ctl get --prefix /hostlet/events/ -w json | python3 -c '
import base64, json, sys
kvs = json.load(sys.stdin).get("kvs", [])
ev = [json.loads(base64.b64decode(kv["value"])) for kv in kvs]
print(sum(1 for e in ev if e["reason"] == "EtcdUpgraded" and e["timestamp"] >= sys.argv[1]))' "$since"
}
deadline=$((SECONDS + 600))
until [ "$(count_done 2>/dev/null || echo 0)" -ge 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "hostlet did not upgrade 3 members" >&2; tail -20 "$WORK"/agent-*.log >&2; exit 1; }
  sleep 0.2
done
stop_probe
read -r hostlet_stall hostlet_failed < <(longest_stall "$WORK/probe-hostlet")
read -r hostlet_total hostlet_longest first_restart between < <(
  ctl get --prefix /hostlet/events/ -w json | python3 -c '
import base64, json, re, sys
from datetime import datetime
since, swapped = sys.argv[1], float(sys.argv[2])
ts = lambda s: datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
kvs = json.load(sys.stdin).get("kvs", [])
ev = sorted((json.loads(base64.b64decode(kv["value"])) for kv in kvs), key=lambda e: e["timestamp"])
done = [e for e in ev if e["reason"] == "EtcdUpgraded" and e["timestamp"] >= since][:3]
out = [float(re.search(r"not serving for ([0-9.]+)s", e["message"]).group(1)) for e in done]
ends = [ts(e["timestamp"]) for e in done]
starts = [t - o for t, o in zip(ends, out)]
gaps = [starts[i + 1] - ends[i] for i in range(len(ends) - 1)]
print("%.3f %.3f %.3f %.3f" % (ends[-1] - swapped, max(out), starts[0] - swapped, max(gaps)))' "$since" "$t_swap"
)
ratio=$(awk -v h="$hostlet_total" -v m="$manual_total" 'BEGIN { printf "%.3f", h / m }')
echo "hostlet's turns (per member: checks, snapshot, leadership move, restart until serving, until caught up):" >&2
grep -h "etcd upgrade turn done" "$WORK"/agent-*.log | sed 's/\x1b\[[0-9;]*m//g' >&2 || true

echo
echo "etcd 3.4.23 -> 3.5.1, 3 members, ${DB_MB} MB of data"
echo "by hand (baseline): total ${manual_total} s (snapshot ${manual_snap} s), longest member out ${manual_longest} s, longest write stall ${manual_stall} s (${manual_failed} failed puts)"
echo "hostlet rolling:    total ${hostlet_total} s from the swap, longest member out ${hostlet_longest} s, longest write stall ${hostlet_stall} s (${hostlet_failed} failed puts)"
echo "  first restart ${first_restart} s after the swap; longest gap between members ${between} s (the lock's handover)"
echo "ratio total hostlet/by hand ${ratio} (target <= 1.5)"
printf '{"bench":"upgrade","db_mb":%s,"manual_total_s":%s,"manual_snapshot_s":%s,"hostlet_total_s":%s,"ratio":%s,"manual_longest_member_s":%s,"hostlet_longest_member_s":%s,"manual_write_stall_s":%s,"hostlet_write_stall_s":%s,"manual_failed_puts":%s,"hostlet_failed_puts":%s,"hostlet_first_restart_s":%s,"hostlet_longest_gap_s":%s}\n' \
  "$DB_MB" "$manual_total" "$manual_snap" "$hostlet_total" "$ratio" "$manual_longest" "$hostlet_longest" "$manual_stall" "$hostlet_stall" \
  "$manual_failed" "$hostlet_failed" "$first_restart" "$between"
