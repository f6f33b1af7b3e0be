#!/usr/bin/env bash
# an image fetched from another node (peer pull) beside `docker save | docker load` piped by hand, SIZE_MB (200)
#
# Environment: SIZE_MB (200). Two engines on this machine: the host's Docker (node 1, a voter) and a dockerd
# of the bench's own in a network namespace it makes (node 2, a worker; no registry in reach), its data under
# a temp dir. An image of busybox and SIZE_MB of random bytes is built on the host's engine. Baseline, in the
# same run: `docker save IMAGE | docker -H <engine 2> load`, timed by hand; then the image is removed from
# engine 2. Then both agents start (TLS, as deployed), node 1's record lists the image, and a pod naming it
# (IfNotPresent) is put on node 2: its pull fails and node 2's agent fetches it from node 1's. Figures: the
# fetch as the agent times it (hostlet_peer_image_fetch_duration_seconds: the request until the image is
# loaded), the pod put until the image is on engine 2 (the failed pull and the queue included), and their
# ratios to the baseline (target ≤ 1.2 for the fetch). Needs root (a network namespace), Docker, busybox-static.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source hack/bench-lib.sh

SIZE_MB="${SIZE_MB:-200}"
NODE_PREFIX="bench-peer"
IMAGE="bench-peer/app:1"
WORK="$(mktemp -d)"
NS="hostlet-bench-peer-$$"
EB="$WORK/engine"
PIDS=()
EB_PID=""
DB() { docker --host "unix://$EB/docker.sock" "$@"; }
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  docker ps -aq --filter "label=io.hostlet.node=$NODE_PREFIX-1" | xargs -r docker rm -f >/dev/null 2>&1 || true
  if [ -n "$EB_PID" ]; then
    DB ps -aq 2>/dev/null | xargs -r docker --host "unix://$EB/docker.sock" rm -f >/dev/null 2>&1 || true
    kill -TERM "$EB_PID" 2>/dev/null || true
    wait "$EB_PID" 2>/dev/null || true
  fi
  ip netns del "$NS" 2>/dev/null || true
  docker rmi "$IMAGE" >/dev/null 2>&1 || true
  if [ -n "${KEEP_LOGS:-}" ]; then mkdir -p "$KEEP_LOGS" && cp "$WORK"/*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
  for m in $(awk -v w="$WORK" 'index($2, w) == 1 {print $2}' /proc/self/mounts); do umount -l "$m" || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
die() { echo "peerimage: $*" >&2; exit 1; }

build_hostlet
bash hack/images.sh >/dev/null

# Engine 2: a dockerd of the bench's own, in a network namespace of its own (its bridge and routes are its
# own; the host's engine is not touched; no iptables rules).
mkdir -p "$EB/root" "$EB/exec"
echo '{}' >"$EB/daemon.json"
ip netns add "$NS"
nsenter --net="/run/netns/$NS" dockerd --config-file="$EB/daemon.json" --data-root="$EB/root" \
  --exec-root="$EB/exec" --pidfile="$EB/dockerd.pid" --host="unix://$EB/docker.sock" \
  --iptables=false --ip-masq=false --ip6tables=false >"$WORK/dockerd.log" 2>&1 &
EB_PID=$!
deadline=$((SECONDS + 60))
until DB info >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || { tail -20 "$WORK/dockerd.log" >&2; die "engine 2 did not answer"; }
  sleep 0.1
done

# The image, on the host's engine: busybox and SIZE_MB of random bytes (nothing compresses it).
ctx="$WORK/ctx"
mkdir -p "$ctx"
cp /bin/busybox "$ctx/busybox"
head -c "$((SIZE_MB * 1024 * 1024))" /dev/urandom >"$ctx/blob"
printf 'FROM scratch\nCOPY busybox /bin/busybox\nCOPY blob /blob\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\nENV PATH=/bin\nCMD ["sh"]\n' >"$ctx/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" "$ctx" >/dev/null
rm -rf "$ctx"
BYTES=$(docker image inspect -f '{{.Size}}' "$IMAGE")
# Engine 2 needs the pause image for the pod.
docker save busybox:latest | DB load >/dev/null

# Baseline: by hand, the same bytes from engine 1 into engine 2.
t0=$(now)
docker save "$IMAGE" | DB load >/dev/null
t1=$(now)
BY_HAND=$(elapsed "$t0" "$t1")
DB rmi "$IMAGE" >/dev/null

# The agents, TLS as deployed.
declare -A API METRICS CLIENT DIR
launch() {
  local i=$1; shift
  API[$i]=$(free_port); METRICS[$i]=$(free_port); CLIENT[$i]=$(free_port)
  local peer; peer=$(free_port)
  DIR[$i]="$WORK/n$i"
  "$HOSTLET" run --node-name "$NODE_PREFIX-$i" --data-dir "${DIR[$i]}" --advertise-address 127.0.0.1 \
    --listen "127.0.0.1:${API[$i]}" --metrics-listen "127.0.0.1:${METRICS[$i]}" \
    --etcd-client-port "${CLIENT[$i]}" --etcd-peer-port "$peer" "$@" >"$WORK/agent-$i.log" 2>&1 &
  PIDS+=($!)
  wait_ready "$i"
}
launch 1 --etcd-voters 1
launch 2 --server "https://127.0.0.1:${API[1]}" --token-file "${DIR[1]}/token" --role worker \
  --docker-host "unix://$EB/docker.sock"
cli() { "$HOSTLET" "$@" --data-dir "${DIR[1]}"; }
deadline=$((SECONDS + 90))
until cli node ls -o json | grep -q "\"$IMAGE\""; do
  [ "$SECONDS" -lt "$deadline" ] || die "node 1's record never listed $IMAGE"
  sleep 0.2
done

cat >"$WORK/pod.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: fetched}
spec:
  containers:
  - name: app
    image: $IMAGE
    imagePullPolicy: IfNotPresent
    command: [sleep, "86400"]
EOF
t0=$(now)
cli pod apply -f "$WORK/pod.yaml" --node "$NODE_PREFIX-2" >/dev/null
deadline=$((SECONDS + 600))
until DB image inspect "$IMAGE" >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || { tail -20 "$WORK/agent-2.log" >&2; die "the image never reached engine 2"; }
  sleep 0.05
done
t1=$(now)
PUT_TO_LOADED=$(elapsed "$t0" "$t1")
metrics=$(curl -s "http://127.0.0.1:${METRICS[2]}/metrics")
FETCH=$(awk '$1 == "hostlet_peer_image_fetch_duration_seconds_sum" {printf "%.3f", $2}' <<<"$metrics")
FETCHED_BYTES=$(awk '$1 == "hostlet_peer_image_fetch_bytes_total" {print $2}' <<<"$metrics")
[ -n "$FETCH" ] || die "no fetch recorded; agent 2's log: $(tail -5 "$WORK/agent-2.log")"
cli pod delete fetched --node "$NODE_PREFIX-2" >/dev/null || true

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "image: $IMAGE, $((BYTES / 1024 / 1024)) MiB ($FETCHED_BYTES bytes of docker save sent)"
echo "by hand (docker save | docker load):   ${BY_HAND} s"
echo "peer fetch (the agent's own timing):   ${FETCH} s   ratio $(ratio "$FETCH" "$BY_HAND")  (target <= 1.2)"
echo "pod put -> image on engine 2:          ${PUT_TO_LOADED} s   ratio $(ratio "$PUT_TO_LOADED" "$BY_HAND")"
printf '{"bench":"peerimage","size_mb":%s,"by_hand_s":%s,"fetch_s":%s,"fetch_ratio":%s,"put_to_loaded_s":%s,"put_ratio":%s}\n' \
  "$SIZE_MB" "$BY_HAND" "$FETCH" "$(ratio "$FETCH" "$BY_HAND")" "$PUT_TO_LOADED" "$(ratio "$PUT_TO_LOADED" "$BY_HAND")"
