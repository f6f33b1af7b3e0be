#!/usr/bin/env bash
# 3 voters + 20 workers: a pod set's rollout (maxUnavailable 1 and 25 %) against a hand loop of pod apply; a new node's pod
#
# A TLS cluster on loopback: 3 voters, then WORKERS (20) workers labelled tier=edge. A pod set of busybox
# (ready by an exec probe every second) runs on every worker. Then, for maxUnavailable 1 and 25 %, a
# template change is timed from `hostlet podset apply` until every node has an available pod of it (the
# set's status), while an etcd watch of every host's pods and statuses records the most nodes seen at once
# without an available pod of the set (the key's and the status's template hash the same, ready). The floor,
# in the same run: plain pods on the same workers, replaced by hand with `hostlet pod apply --node` in
# batches of the same size (1, and 25 % of the workers), each batch waiting until each of its pods is ready
# in a new container, as an operator's loop would. Ratios: rollout / hand loop (target ≤ 1.2). Last, one
# more worker with the label joins: the time from its node record to its pod of the set Running (target ≤ 5 s).
#
# Environment: WORKERS (20), READY_TIMEOUT (120), ROLLOUT_TIMEOUT (600), KEEP_LOGS=DIR keeps the agents'
# logs. Needs the Docker engine, busybox:latest (hack/images.sh) and /usr/bin/etcd. Every agent, etcd,
# container and data dir is removed on exit. Nothing is asserted; the last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
NODE_PREFIX="podset$$"
source hack/bench-lib.sh

WORKERS="${WORKERS:-20}"
READY_TIMEOUT="${READY_TIMEOUT:-120}"
ROLLOUT_TIMEOUT="${ROLLOUT_TIMEOUT:-600}"
BENCH=podset
source hack/bench-cluster.sh

SET=bench-agent
cli() { "$HOSTLET" "$@" --data-dir "${DIR[v1]}"; }

# set_yaml SECONDS MAX_UNAVAILABLE: the set, its pods sleeping SECONDS.
set_yaml() {
  cat <<EOF
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: $SET}
spec:
  selector: {matchLabels: {app: $SET}}
  updateStrategy: {rollingUpdate: {maxUnavailable: $2}}
  template:
    metadata: {labels: {app: $SET}}
    spec:
      nodeSelector: {tier: edge}
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: busybox:latest
        imagePullPolicy: Never
        command: [sleep, "$1"]
        readinessProbe: {exec: {command: ["true"]}, periodSeconds: 1}
EOF
}
# hand_yaml SECONDS: the hand loop's pod, the same but for its name.
hand_yaml() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: hand}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:latest
    imagePullPolicy: Never
    command: [sleep, "$1"]
    readinessProbe: {exec: {command: ["true"]}, periodSeconds: 1}
EOF
}

# Whether the set's status says revision rollout complete on N nodes, all available.
rolled_out() {
  cli podset get "$SET" -o json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin).get("status") or {}
n = int(sys.argv[1])
ok = (s.get("rollout") or {}).get("complete") and s.get("desiredNumberScheduled") == n \
    and s.get("numberAvailable") == n and s.get("updatedNumberScheduled") == n
sys.exit(0 if ok else 1)' "$1"
}
await_rollout() {
  local n=$1 deadline=$((SECONDS + ROLLOUT_TIMEOUT))
  until rolled_out "$n"; do
    [ "$SECONDS" -lt "$deadline" ] || { cli podset get "$SET" >&2 || true; die "the rollout did not complete"; }
    sleep 0.2
  done
}

# The most nodes without an available pod of the set, from the watch log ($1) over the listing ($2).
most_unavailable() {
  python3 - "$1" "$2" "$WORKERS" "$NODE_PREFIX" <<'EOF'
import base64, json, sys
watch, listing, workers, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
nodes = [f"{prefix}-w{i}" for i in range(1, workers + 1)]
state = {}
def b(s): return base64.b64decode(s).decode()
for kv in json.load(open(listing)).get("kvs", []):
    state[b(kv["key"])] = b(kv.get("value", ""))
def unavailable():
    n = 0
    for node in nodes:
        pod = state.get(f"/hostlet/hosts/{node}/pods/bench-agent")
        st = state.get(f"/hostlet/hosts/{node}/status/bench-agent")
        try:
            h = json.loads(pod)["metadata"]["annotations"]["hostlet.io/podset-hash"]
            s = json.loads(st)
            ok = s.get("ready") and s.get("revisionHash") == h
        except Exception:
            ok = False
        n += 0 if ok else 1
    return n
most = 0
for line in open(watch):
    line = line.strip()
    if not line.startswith("{"):
        continue
    for ev in json.loads(line).get("Events") or []:
        kv = ev["kv"]
        key = b(kv["key"])
        if ev.get("type") == 1:
            state.pop(key, None)
        else:
            state[key] = b(kv.get("value", ""))
    most = max(most, unavailable())
print(most)
EOF
}

# rollout SECONDS MAX_UNAVAILABLE: times a template change; sets T (seconds) and U (most unavailable).
rollout() {
  local t0 rev watch_pid
  ctl "$(voter_eps)" get --prefix /hostlet/hosts/ -w json >"$WORK/listing.json"
  rev=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["header"]["revision"])' "$WORK/listing.json")
  ETCDCTL_API=3 etcdctl --endpoints "$(voter_eps)" $(tls_args) watch --prefix /hostlet/hosts/ \
    --rev "$((rev + 1))" -w json >"$WORK/watch.log" 2>/dev/null &
  watch_pid=$!
  set_yaml "$1" "$2" >"$WORK/set.yaml"
  t0=$(now)
  cli podset apply -f "$WORK/set.yaml" >/dev/null
  await_rollout "$WORKERS"
  T=$(elapsed "$t0" "$(now)")
  sleep 1
  kill "$watch_pid" 2>/dev/null || true; wait "$watch_pid" 2>/dev/null || true
  U=$(most_unavailable "$WORK/watch.log" "$WORK/listing.json")
}

# The container id of the hand pod on NODE when its status is ready, else empty.
hand_ready_id() {
  ctl "$(voter_eps)" get "/hostlet/hosts/$1/status/hand" --print-value-only 2>/dev/null | python3 -c '
import json, sys
try:
    s = json.load(sys.stdin)
    print(s["containers"][0]["containerId"] if s.get("ready") else "")
except Exception:
    print("")'
}
# hand SECONDS BATCH: replaces the hand pods BATCH nodes at a time; sets T.
hand() {
  local t0 i j k node deadline
  hand_yaml "$1" >"$WORK/hand.yaml"
  declare -A before
  for i in $(seq 1 "$WORKERS"); do before[$i]=$(hand_ready_id "$NODE_PREFIX-w$i"); done
  t0=$(now)
  for ((i = 1; i <= WORKERS; i += $2)); do
    for ((j = i; j < i + $2 && j <= WORKERS; j++)); do
      cli pod apply -f "$WORK/hand.yaml" --node "$NODE_PREFIX-w$j" >/dev/null
    done
    for ((j = i; j < i + $2 && j <= WORKERS; j++)); do
      node="$NODE_PREFIX-w$j"; deadline=$((SECONDS + READY_TIMEOUT))
      until k=$(hand_ready_id "$node"); [ -n "$k" ] && [ "$k" != "${before[$j]}" ]; do
        [ "$SECONDS" -lt "$deadline" ] || die "hand pod on $node not ready"
        sleep 0.05
      done
    done
  done
  T=$(elapsed "$t0" "$(now)")
}

command -v etcd >/dev/null || die "etcd not found"
docker image inspect busybox:latest >/dev/null 2>&1 || bash hack/images.sh >/dev/null
build_hostlet

echo "3 voters, then $WORKERS workers labelled tier=edge (nodes $NODE_PREFIX-*, data in $WORK)" >&2
start_voters "$((WORKERS + 2))"
for i in $(seq 1 "$WORKERS"); do
  start "w$i" "$NODE_PREFIX-w$i" --server "$SERVER" --token-file "$WORKER_TOKEN_FILE" --role worker --node-label tier=edge
  [ "$R" != timeout ] || { show_log "$NODE_PREFIX-w$i"; die "worker $i not ready"; }
done

echo "the set on $WORKERS workers, and a hand pod beside it on each" >&2
set_yaml 86400 1 >"$WORK/set.yaml"
cli podset apply -f "$WORK/set.yaml" >/dev/null
hand_yaml 86400 >"$WORK/hand.yaml"
for i in $(seq 1 "$WORKERS"); do cli pod apply -f "$WORK/hand.yaml" --node "$NODE_PREFIX-w$i" >/dev/null; done
await_rollout "$WORKERS"
for i in $(seq 1 "$WORKERS"); do
  deadline=$((SECONDS + READY_TIMEOUT))
  until [ -n "$(hand_ready_id "$NODE_PREFIX-w$i")" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "hand pod on worker $i not ready"
    sleep 0.1
  done
done

QUARTER=$(( (WORKERS + 3) / 4 ))
echo "rollout, maxUnavailable 1" >&2
rollout 86401 1; set_1=$T; most_1=$U
echo "hand loop, 1 at a time" >&2
hand 86401 1; hand_1=$T
echo "rollout, maxUnavailable 25% ($QUARTER nodes)" >&2
rollout 86402 "25%"; set_25=$T; most_25=$U
echo "hand loop, $QUARTER at a time" >&2
hand 86402 "$QUARTER"; hand_25=$T

echo "one more worker joins with the label" >&2
n=$((WORKERS + 1))
launch "w$n" "$NODE_PREFIX-w$n" --server "$SERVER" --token-file "$WORKER_TOKEN_FILE" --role worker --node-label tier=edge
deadline=$((SECONDS + READY_TIMEOUT))
until ctl "$(voter_eps)" get "/hostlet/nodes/$NODE_PREFIX-w$n" --print-value-only 2>/dev/null | grep -q .; do
  [ "$SECONDS" -lt "$deadline" ] || die "no node record for worker $n"
  sleep 0.02
done
t_record=$(now)
until ctl "$(voter_eps)" get "/hostlet/hosts/$NODE_PREFIX-w$n/status/$SET" --print-value-only 2>/dev/null | grep -q '"phase":"Running"'; do
  [ "$SECONDS" -lt "$deadline" ] || die "worker $n's pod not running"
  sleep 0.02
done
join_pod=$(elapsed "$t_record" "$(now)")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }
r1=$(ratio "$set_1" "$hand_1")
r25=$(ratio "$set_25" "$hand_25")
printf '%-44s %10s %10s %8s %s\n' "" "pod set" "hand loop" "ratio" "most unavailable"
printf '%-44s %9ss %9ss %8s %s\n' "rollout, maxUnavailable 1 ($WORKERS nodes)" "$set_1" "$hand_1" "$r1" "$most_1 (bound 1)"
printf '%-44s %9ss %9ss %8s %s\n' "rollout, maxUnavailable 25% ($QUARTER at a time)" "$set_25" "$hand_25" "$r25" "$most_25 (bound $QUARTER)"
printf '%-44s %9ss  (target <= 5 s)\n' "a new node's record -> its pod Running" "$join_pod"
printf '{"bench":"podset","workers":%d,"rollout_1_s":%s,"hand_1_s":%s,"ratio_1":%s,"most_unavailable_1":%s,"rollout_25_s":%s,"hand_25_s":%s,"ratio_25":%s,"most_unavailable_25":%s,"batch_25":%d,"join_to_running_s":%s}\n' \
  "$WORKERS" "$set_1" "$hand_1" "$r1" "$most_1" "$set_25" "$hand_25" "$r25" "$most_25" "$QUARTER" "$join_pod"
