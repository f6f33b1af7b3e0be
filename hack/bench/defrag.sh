#!/usr/bin/env bash
# Rolling defragmentation of 3 members on a ~200 MB fragmented db: hostlet's upkeep against etcdctl by hand.
# Three agents on loopback. Each phase fills DB_MB MB (1 MB values), deletes 90 % of it and compacts, with the
# maintenance lock held so that the agents keep out; then the baseline defragments member by member with
# `etcdctl defrag` (followers first, the leader last), once before hostlet's phase and once after (their mean
# is the baseline), and hostlet's phase lets the lock go and the upkeep controllers roll (followers first, leadership handed over, the old leader last). Figures: total rolling
# time (first defrag start to last defrag end), the longest time one member did not serve (its defrag),
# and the longest write stall seen by a writer putting every 50 ms meanwhile. Nothing is asserted; the last
# line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
# PROFILE=debug skips a release build (the figures are etcd's disk work either way).
source hack/bench-lib.sh
build_hostlet
DB_MB="${DB_MB:-200}"
WORK="$(mktemp -d /tmp/hostlet-bench-defrag.XXXXXX)"
PIDS=()
cleanup() {
  [ -n "$PROBE" ] && kill "$PROBE" 2>/dev/null || true
  cleanup_agents
}
trap cleanup EXIT

start_three --snapshot-schedule "0 0 1 1 *" --etcd-defrag-threshold 30% --etcd-defrag-min-free 64MiB
ctl() { ETCDCTL_API=3 etcdctl --endpoints "$EPS" --command-timeout=120s "$@"; }
deadline=$((SECONDS + 120))
until [ "$(ctl member list 2>/dev/null | grep -c ', started, .*, false$' || true)" = 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "no three voters" >&2; ctl member list >&2 || true; exit 1; }
  sleep 0.5
done

head -c 786432 /dev/urandom | base64 -w0 | head -c 1000000 >"$WORK/value" || true

# The endpoint of the leader, and the followers' endpoints.
leader_ep() {
  ETCDCTL_API=3 etcdctl --endpoints "$EPS" endpoint status -w json |
    python3 -c 'import json,sys; s=json.load(sys.stdin); print([e["Endpoint"] for e in s if e["Status"]["leader"]==e["Status"]["header"]["member_id"]][0])'
}

LEASE=""
hold_lock() {
  LEASE=$(ctl lease grant 900 | awk '{print $2}')
  ctl put --lease="$LEASE" /hostlet/etcd/maintenance-lock '{"holder":"bench","operation":"fill","since":"2026-01-01T00:00:00Z"}' >/dev/null
}
release_lock() { ctl lease revoke "$LEASE" >/dev/null; }

# Fills DB_MB MB, deletes 90 % of it, compacts: fragmented members, under the lock.
fragment() {
  local keep=$((DB_MB / 10))
  for i in $(seq 1 "$DB_MB"); do
    if [ "$i" -le "$keep" ]; then k="/keep/$1/$i"; else k="/bench/$1/$i"; fi
    ctl put "$k" <"$WORK/value" >/dev/null
  done
  ctl del --prefix "/bench/$1/" >/dev/null
  local rev
  # A linearizable read's revision includes the deletes (a follower's status may not have applied them yet,
  # and a compaction below them frees nothing).
  rev=$(ctl get /bench-revision -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
  ctl compact "$rev" --physical >/dev/null
  ctl del --prefix "/keep/$1/" >/dev/null
  ETCDCTL_API=3 etcdctl --endpoints "$EPS" endpoint status -w table >&2
}


# manual_phase NAME: the baseline, by hand; sets m_total, m_longest, m_stall, m_failed.
manual_phase() {
  echo "manual ($1): filling ${DB_MB} MB, deleting 90 %, compacting..." >&2
  hold_lock
  fragment "$1"
  local leader ep t0 t1 d first last
  leader=$(leader_ep)
  local order=()
  for ep in ${EPS//,/ }; do [ "$ep" = "$leader" ] || order+=("$ep"); done
  order+=("$leader")
  start_probe "$EPS" "$WORK/probe-$1"
  m_longest=0
  first=$(now)
  for ep in "${order[@]}"; do
    t0=$(now); ETCDCTL_API=3 etcdctl --endpoints "$ep" --command-timeout=600s defrag >/dev/null; t1=$(now)
    d=$(elapsed "$t0" "$t1")
    echo "etcdctl defrag $ep: $d s" >&2
    m_longest=$(larger "$m_longest" "$d")
  done
  last=$(now)
  stop_probe
  release_lock
  m_total=$(elapsed "$first" "$last")
  read -r m_stall m_failed < <(longest_stall "$WORK/probe-$1")
}

# The baseline runs before and after hostlet's phase and counts their mean: a later phase meets a disk
# still writing back the earlier fills, and neither side should have the fresher one.
manual_phase manual
before_total=$m_total before_longest=$m_longest before_stall=$m_stall before_failed=$m_failed

echo "hostlet: filling ${DB_MB} MB, deleting 90 %, compacting..." >&2
hold_lock
fragment hostlet
start_probe "$EPS" "$WORK/probe-hostlet"
since=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
t_release=$(now)
release_lock
deadline=$((SECONDS + 600))
count_done() {
  ctl get --prefix /hostlet/events/ -w json | python3 -c '
import base64, json, sys
since = sys.argv[1]
kvs = json.load(sys.stdin).get("kvs", [])
ev = [json.loads(base64.b64decode(kv["value"])) for kv in kvs]
print(sum(1 for e in ev if e["reason"] == "EtcdDefragmented" and e["timestamp"] >= since))' "$since"
}
until [ "$(count_done)" -ge 3 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "hostlet did not defragment 3 members" >&2; tail -5 "$WORK"/agent-*.log >&2; exit 1; }
  sleep 0.2
done
stop_probe
read -r hostlet_stall hostlet_failed < <(longest_stall "$WORK/probe-hostlet")
read -r hostlet_total hostlet_longest detect_s overlap leader_last < <(
  ctl get --prefix /hostlet/events/ -w json | python3 -c '
import base64, json, sys
from datetime import datetime
since, released = sys.argv[1], float(sys.argv[2])
ts = lambda s: datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
kvs = json.load(sys.stdin).get("kvs", [])
ev = sorted((json.loads(base64.b64decode(kv["value"])) for kv in kvs), key=lambda e: e["timestamp"])
ev = [e for e in ev if e["timestamp"] >= since]
member = lambda e: e["message"].split("member ")[1].split()[0]
starts = [(ts(e["timestamp"]), member(e)) for e in ev if e["reason"] == "EtcdDefragmenting"][:3]
ends = {member(e): ts(e["timestamp"]) for e in ev if e["reason"] == "EtcdDefragmented"}
spans = [(s, ends[m], m) for s, m in starts]
overlap = any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1))
moved = [e["message"].split()[3] for e in ev if e["reason"] == "EtcdLeaderMoved"]
leader_last = int(bool(moved) and spans[-1][2] == moved[0])
print("%.3f %.3f %.3f %d %d" % (spans[-1][1] - spans[0][0], max(e - s for s, e, _ in spans),
      spans[0][0] - released, overlap, leader_last))' "$since" "$t_release"
)
manual_phase manual-after
manual_total=$(awk -v a="$before_total" -v b="$m_total" 'BEGIN { printf "%.3f", (a + b) / 2 }')
manual_longest=$(larger "$before_longest" "$m_longest")
manual_stall=$(larger "$before_stall" "$m_stall")
manual_failed=$((before_failed + m_failed))
ratio=$(awk -v h="$hostlet_total" -v m="$manual_total" 'BEGIN { printf "%.3f", h / m }')

echo
echo "db ${DB_MB} MB per phase, 3 members"
echo "etcdctl by hand (baseline): total ${manual_total} s (mean of ${before_total} s before and ${m_total} s after hostlet's phase), longest member out ${manual_longest} s, longest write stall ${manual_stall} s (${manual_failed} failed puts)"
echo "hostlet rolling:            total ${hostlet_total} s, longest member out ${hostlet_longest} s, longest write stall ${hostlet_stall} s (${hostlet_failed} failed puts)"
echo "  started ${detect_s} s after the lock went (poll interval 5 s); overlapping defrags: ${overlap}; leader last: ${leader_last}"
echo "ratio total hostlet/manual ${ratio} (target <= 1.1)"
printf '{"bench":"defrag","db_mb":%s,"manual_before_s":%s,"manual_after_s":%s,"manual_total_s":%s,"hostlet_total_s":%s,"ratio":%s,"manual_longest_member_s":%s,"hostlet_longest_member_s":%s,"manual_write_stall_s":%s,"hostlet_write_stall_s":%s,"manual_failed_puts":%s,"hostlet_failed_puts":%s,"hostlet_detect_s":%s,"overlap":%s,"leader_last":%s}\n' \
  "$DB_MB" "$before_total" "$m_total" "$manual_total" "$hostlet_total" "$ratio" "$manual_longest" "$hostlet_longest" "$manual_stall" "$hostlet_stall" \
  "$manual_failed" "$hostlet_failed" "$detect_s" "$overlap" "$leader_last"
