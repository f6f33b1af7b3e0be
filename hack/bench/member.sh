#!/usr/bin/env bash
# etcd member: time to /readyz for a fresh node, a restart and a join, beside bare etcd
#
# Run through `hack/bench.sh member`. From process start to `/readyz` answering 200: a fresh single node, a
# restart of that node, and a third node's join (after the second joined and was promoted: etcd allows one
# learner at a time). The floor, measured in the same run: the bare etcd binary started on an empty dir until
# its /health answers. Everything on loopback, fresh temp dirs, nothing asserted. The last line is one JSON
# object. KEEP=1 keeps the work dir (logs) for a look afterwards.
set -euo pipefail

cd "$(dirname "$0")/../.."
source hack/bench-lib.sh
build_hostlet
WORK="$(mktemp -d /tmp/hostlet-bench-member.XXXXXX)"
PIDS=()

cleanup() {
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && wait "$p" 2>/dev/null || true
    done
    if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi
}
trap cleanup EXIT



# Polls URL until it answers 200, at most 60 s; on timeout shows the end of LOG and fails.
wait_200() {
    local url="$1" log="$2" deadline=$((SECONDS + 60))
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" = 200 ]; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "timed out waiting for $url; the end of $log:" >&2
            tail -n 20 "$log" >&2 || true
            return 1
        fi
        sleep 0.01
    done
}

# node NAME: allocates its ports and data dir (the API, METRICS, CLIENT, PEER, DATA arrays).
declare -A API METRICS CLIENT PEER DATA
node() {
    local n="$1"
    API[$n]=$(free_port); METRICS[$n]=$(free_port); CLIENT[$n]=$(free_port); PEER[$n]=$(free_port)
    DATA[$n]="$WORK/$n"
}

# start NAME [flags…]: starts hostlet for NAME in the background; sets LAST_PID.
start() {
    local n="$1"; shift
    "$HOSTLET" run --node-name="$n" --data-dir="${DATA[$n]}" --advertise-address=127.0.0.1 \
        --listen="127.0.0.1:${API[$n]}" --metrics-listen="127.0.0.1:${METRICS[$n]}" \
        --etcd-client-port="${CLIENT[$n]}" --etcd-peer-port="${PEER[$n]}" "$@" \
        >>"$WORK/$n.log" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}

etcdctl_n1() {
    ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:${CLIENT[n1]}" \
        --cacert="${DATA[n1]}/tls/ca.crt" --cert="${DATA[n1]}/tls/client.crt" \
        --key="${DATA[n1]}/tls/client.key" "$@"
}

# The floor: the bare etcd binary on an empty dir.
ec=$(free_port); ep=$(free_port)
t0=$(now)
etcd --name floor --data-dir "$WORK/floor" \
    --listen-client-urls "http://127.0.0.1:$ec" --advertise-client-urls "http://127.0.0.1:$ec" \
    --listen-peer-urls "http://127.0.0.1:$ep" --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
    --initial-cluster "floor=http://127.0.0.1:$ep" >"$WORK/floor.log" 2>&1 &
floor_pid=$!
PIDS+=("$floor_pid")
wait_200 "http://127.0.0.1:$ec/health" "$WORK/floor.log"
etcd_alone=$(elapsed "$t0" "$(now)")
kill -TERM "$floor_pid"; wait "$floor_pid" 2>/dev/null || true
echo "bare etcd, empty dir, to /health:        ${etcd_alone} s"

# A fresh single node (TLS, CA and certificates generated on the way).
node n1
t0=$(now)
start n1
n1_pid=$LAST_PID
wait_200 "http://127.0.0.1:${METRICS[n1]}/readyz" "$WORK/n1.log"
fresh=$(elapsed "$t0" "$(now)")
echo "hostlet fresh single node, to /readyz:   ${fresh} s"

# A restart of it.
kill -TERM "$n1_pid"; wait "$n1_pid" 2>/dev/null || true
t0=$(now)
start n1
wait_200 "http://127.0.0.1:${METRICS[n1]}/readyz" "$WORK/n1.log"
restart=$(elapsed "$t0" "$(now)")
echo "hostlet restart of that node, to /readyz: ${restart} s"

# The second node joins and is promoted.
node n2
start n2 --server="https://127.0.0.1:${API[n1]}" --token-file="${DATA[n1]}/token"
wait_200 "http://127.0.0.1:${METRICS[n2]}/readyz" "$WORK/n2.log"
# Promote it unless the learner manager did already.
while :; do
    learner_id=$(etcdctl_n1 member list | awk -F', ' '$6 == "true" { print $1 }')
    [ -z "$learner_id" ] && break
    etcdctl_n1 member promote "$learner_id" >/dev/null 2>&1 || sleep 0.05
done
# etcd refuses new members ("unhealthy cluster") until every voter has been connected for 5 s; a third
# node joining later than that is the case measured.
sleep 5

# The third node's join, timed.
node n3
t0=$(now)
start n3 --server="https://127.0.0.1:${API[n1]}" --token-file="${DATA[n1]}/token"
wait_200 "http://127.0.0.1:${METRICS[n3]}/readyz" "$WORK/n3.log"
join=$(elapsed "$t0" "$(now)")
echo "hostlet third node join, to /readyz:     ${join} s"

printf '{"bench":"member","fresh_ready_s":%s,"restart_ready_s":%s,"join_serving_s":%s,"etcd_alone_ready_s":%s}\n' \
    "$fresh" "$restart" "$join" "$etcd_alone"
