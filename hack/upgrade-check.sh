#!/usr/bin/env bash
# The guide's "Moving a cluster to the node CA" runbook, run for real: a cluster of an earlier hostlet
# (3 voters + 1 worker, TLS as deployed, a pod on every node) upgraded in place to this one, voters first
# one at a time, then the worker.
#
#   hack/upgrade-check.sh REF      REF: the earlier version, a commit of this repository (built here, in a
#                                  worktree under the work dir, with its own target dir: minutes)
#   OLD_HOSTLET=PATH hack/upgrade-check.sh   an earlier hostlet binary already built
#   NEW_HOSTLET=PATH                         this version's binary (default: built here, as PROFILE says)
#
# Checked, each line PASS or FAIL: no container of any pod restarted or replaced; every agent ready with
# this version; the worker's data dir holds no CA key and none of its key pairs opens etcd; every
# certificate (client, server, peer) the worker and the voters held before the move is refused by every
# voter's etcd, on its client port and on its peer port (while each voter's current ones are accepted); `hostlet node certs` lists no node holding old credentials; a pod
# applied afterwards runs on the worker. Exit status 1 if any check failed.
# Needs Docker, busybox:latest (hack/images.sh) and /usr/bin/etcd. Everything it starts is removed on
# exit; KEEP_LOGS=DIR keeps the agents' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/bench-lib.sh
PROFILE="${PROFILE:-debug}"
NODE_PREFIX="upg$$"
WORK="$(mktemp -d /tmp/hostlet-upgrade-check.XXXXXX)"
declare -A PID DIR API METRICS CLIENT PEER
FAILED=0

cleanup() {
  local rc=$? k ids
  trap - EXIT INT TERM
  for k in "${!PID[@]}"; do kill -TERM "${PID[$k]}" 2>/dev/null || true; done
  for k in "${!PID[@]}"; do wait "${PID[$k]}" 2>/dev/null || true; done
  ids=$(docker ps -a --filter "label=io.hostlet.node" --format '{{.ID}} {{.Labels}}' | awk -v p="io.hostlet.node=$NODE_PREFIX-" 'index($0, p) {print $1}')
  [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  if [ -n "${KEEP_LOGS:-}" ]; then mkdir -p "$KEEP_LOGS" && cp "$WORK"/*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
  [ -z "${OLD_TREE:-}" ] || git worktree remove --force "$OLD_TREE" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "upgrade-check: $*" >&2; exit 1; }
check() { # check NAME COMMAND...: runs the command, prints PASS or FAIL
  local name=$1; shift
  if "$@"; then echo "PASS  $name"; else echo "FAIL  $name"; FAILED=1; fi
}
eventually() { # eventually SECONDS COMMAND...: true once the command succeeds within the deadline
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ "$SECONDS" -lt "$deadline" ] || return 1; sleep 0.5; done
}

# The earlier version.
if [ -z "${OLD_HOSTLET:-}" ]; then
  ref="${1:?give REF (a commit of the earlier version) or OLD_HOSTLET=PATH}"
  OLD_TREE="$WORK/old-src"
  git worktree add --detach -f "$OLD_TREE" "$ref" >/dev/null
  echo "building $ref (earlier version) in $OLD_TREE" >&2
  (cd "$OLD_TREE" && CARGO_TARGET_DIR="$WORK/old-target" cargo build --quiet --bin hostlet)
  OLD_HOSTLET="$WORK/old-target/debug/hostlet"
fi
[ -x "$OLD_HOSTLET" ] || die "$OLD_HOSTLET: not an executable"
if [ -z "${NEW_HOSTLET:-}" ]; then build_hostlet; NEW_HOSTLET="$HOSTLET"; fi
docker image inspect busybox:latest >/dev/null 2>&1 || bash hack/images.sh >/dev/null

# launch K BIN [FLAGS...]: starts (or restarts, same ports and data dir) agent K with binary BIN.
launch() {
  local k=$1 bin=$2; shift 2
  if [ -z "${DIR[$k]:-}" ]; then
    DIR[$k]="$WORK/$k"; API[$k]=$(free_port); METRICS[$k]=$(free_port); CLIENT[$k]=$(free_port); PEER[$k]=$(free_port)
  fi
  "$bin" run --node-name "$NODE_PREFIX-$k" --data-dir "${DIR[$k]}" --advertise-address 127.0.0.1 \
    --listen "127.0.0.1:${API[$k]}" --metrics-listen "127.0.0.1:${METRICS[$k]}" \
    --etcd-client-port "${CLIENT[$k]}" --etcd-peer-port "${PEER[$k]}" "$@" >>"$WORK/$k.log" 2>&1 &
  PID[$k]=$!
}
ready() { [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:${METRICS[$1]}/readyz" || true)" = 200 ]; }
await_ready() { eventually 180 ready "$1" || { tail -30 "$WORK/$1.log" >&2; die "$1 not ready"; }; }
stop() { kill -TERM "${PID[$1]}"; wait "${PID[$1]}" 2>/dev/null || true; }
hl() { local k=$1; shift; "$NEW_HOSTLET" "$@" --data-dir "${DIR[$k]}"; }
# opens K CERT KEY: the pair opens voter K's etcd (a read answered).
opens() {
  ETCDCTL_API=3 etcdctl --endpoints "https://127.0.0.1:${CLIENT[$1]}" --dial-timeout=3s --command-timeout=3s \
    --cacert "${DIR[$1]}/tls/ca.crt" --cert "$2" --key "$3" get /hostlet/x >/dev/null 2>&1
}
# opens_peer K CERT KEY: the pair is let into voter K's etcd peer port (its /members answered).
opens_peer() {
  [ "$(curl --http1.1 -s -m 5 -o /dev/null -w '%{http_code}' --cacert "${DIR[$1]}/tls/ca.crt" --cert "$2" --key "$3" \
    "https://127.0.0.1:${PEER[$1]}/members" || true)" = 200 ]
}
containers() { docker ps -q --no-trunc --filter "label=io.hostlet.node=$NODE_PREFIX-$1" | sort | tr '\n' ' '; }
pod() { # pod NODE NAME: applies a busybox pod for NODE through v1
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, "3600"]\n' "$2" >"$WORK/$2.yaml"
  "$3" pod apply -f "$WORK/$2.yaml" --node "$NODE_PREFIX-$1" --data-dir "${DIR[v1]}" >/dev/null
}
running() { [ -n "$(docker ps -q --filter "label=io.hostlet.node=$NODE_PREFIX-$1" --filter "label=io.hostlet.pod=$2")" ]; }

# ---- The cluster as the earlier version makes it ----
echo "earlier version: $("$OLD_HOSTLET" --version 2>/dev/null || echo '?'); this one: $("$NEW_HOSTLET" --version)" >&2
launch v1 "$OLD_HOSTLET" --etcd-voters 3
await_ready v1
for k in v2 v3 w1; do
  # The way an earlier version took it (it reads no token file); loopback only, and gone with the test.
  launch "$k" "$OLD_HOSTLET" --server "https://127.0.0.1:${API[v1]}" --token "$(cat "${DIR[v1]}/token")"
  await_ready "$k"
done
eventually 120 test -f "${DIR[w1]}/db/worker" || die "the fourth host is not a worker"
for k in v1 v2 v3 w1; do pod "$k" "p-$k" "$OLD_HOSTLET"; done
for k in v1 v2 v3 w1; do eventually 120 running "$k" "p-$k" || die "pod p-$k not running"; done
declare -A BEFORE
for k in v1 v2 v3 w1; do BEFORE[$k]=$(containers "$k"); done
mkdir -m 700 "$WORK/old-certs"
for k in v1 v2 v3 w1; do
  for r in client server peer; do
    [ -f "${DIR[$k]}/tls/$r.crt" ] || continue
    cp "${DIR[$k]}/tls/$r.crt" "$WORK/old-certs/$k-$r.crt"; cp "${DIR[$k]}/tls/$r.key" "$WORK/old-certs/$k-$r.key"
  done
done
opens v1 "$WORK/old-certs/w1-client.crt" "$WORK/old-certs/w1-client.key" || die "the worker's certificate did not open etcd before the move (nothing to check)"
opens_peer v1 "$WORK/old-certs/w1-peer.crt" "$WORK/old-certs/w1-peer.key" || die "the worker's peer certificate did not open the peer port before the move (nothing to check)"
echo "earlier version up: 3 voters, 1 worker, a pod on each; the worker's certificate opens etcd" >&2

# ---- The runbook ----
hl v1 etcd snapshot save --name pre-node-ca >/dev/null 2>&1 || "$OLD_HOSTLET" etcd snapshot save --name pre-node-ca --data-dir "${DIR[v1]}" >/dev/null 2>&1 || true
for k in v1 v2 v3; do
  stop "$k"; launch "$k" "$NEW_HOSTLET"; await_ready "$k"
  echo "voter $k upgraded" >&2
done
stop w1; launch w1 "$NEW_HOSTLET"; await_ready w1
echo "worker upgraded" >&2

# ---- Checks ----
no_old_credentials() { hl v1 node certs 2>&1 | grep -q "yes (old credentials)" && return 1; hl v1 node certs >/dev/null 2>&1; }
check "hostlet node certs lists no node with old credentials" eventually 120 no_old_credentials
for k in v1 v2 v3; do
  check "voter $k's current certificate opens its etcd" eventually 60 opens "$k" "${DIR[$k]}/tls/client.crt" "${DIR[$k]}/tls/client.key"
  check "voter $k's current peer certificate opens its peer port" opens_peer "$k" "${DIR[$k]}/tls/peer.crt" "${DIR[$k]}/tls/peer.key"
  for f in "$WORK"/old-certs/*.crt; do
    o=$(basename "$f" .crt)
    refused() { ! opens "$1" "$2" "${2%.crt}.key"; }
    check "$o certificate from before the move refused by $k's etcd" eventually 60 refused "$k" "$f"
    refused_peer() { ! opens_peer "$1" "$2" "${2%.crt}.key"; }
    check "$o certificate from before the move refused at $k's peer port" eventually 60 refused_peer "$k" "$f"
  done
done
no_ca_key() {
  local f
  for f in $(find "${DIR[w1]}" -name '*.key' -o -name '*.pem'); do
    for ca in "${DIR[v1]}/tls/ca.crt" "${DIR[v1]}/tls/node-ca.crt"; do
      [ "$(openssl pkey -in "$f" -pubout 2>/dev/null)" = "$(openssl x509 -in "$ca" -noout -pubkey 2>/dev/null)" ] && { echo "  $f is a CA key" >&2; return 1; }
    done
  done
  return 0
}
check "the worker's data dir holds no CA key" no_ca_key
no_pair_opens() {
  local crt key
  for crt in $(find "${DIR[w1]}/tls" -name '*.crt'); do
    key="${crt%.crt}.key"; [ -f "$key" ] || continue
    for k in v1 v2 v3; do opens "$k" "$crt" "$key" && { echo "  $crt opens $k's etcd" >&2; return 1; }; done
  done
  return 0
}
check "no key pair in the worker's data dir opens etcd" no_pair_opens
for k in v1 v2 v3 w1; do
  same() { [ "$(containers "$1")" = "${BEFORE[$1]}" ]; }
  check "$k's containers unchanged" same "$k"
  check "$k ready with this version" ready "$k"
done
pod w1 p-after "$NEW_HOSTLET"
check "a pod applied afterwards runs on the worker" eventually 120 running w1 p-after
echo
[ "$FAILED" = 0 ] && echo "upgrade-check: every check passed" || echo "upgrade-check: some checks FAILED"
exit "$FAILED"
