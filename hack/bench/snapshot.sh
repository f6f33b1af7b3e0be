#!/usr/bin/env bash
# Snapshot save through the agent against etcdctl snapshot save on a ~200 MB database (medians of 5).
# `hostlet etcd snapshot save` (through the agent: request key, stream, verify, fsync, rename, record) against
# `etcdctl snapshot save` on the same member, medians of 5 each, in the same run. Then one compressed save.
# Then the upload figure, against a Garage S3 server started here: `hostlet etcd snapshot save` with an
# object-storage target (save, verify, multipart upload, read-back) against `etcdctl snapshot save` followed
# by `s3cmd put` of that file to the same server, medians of RUNS each. Needs garage and s3cmd
# (hack/install-deps.sh --tests). Then the same two figures with a snapshot encryption key (the agent
# restarted with --snapshot-encryption-key-file): encrypted save against the plain hostlet save, encrypted
# save + upload against the plain save + upload, medians of RUNS each, same run (target <= 1.15).
# Nothing is asserted; the last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/bench-lib.sh
build_hostlet
DB_MB="${DB_MB:-200}"
RUNS="${RUNS:-5}"
WORK="$(mktemp -d /tmp/hostlet-bench-snapshot.XXXXXX)"
AGENT=""
GARAGE=""
cleanup() {
  [ -n "$AGENT" ] && kill -TERM "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null || true
  [ -n "$GARAGE" ] && kill -KILL "$GARAGE" 2>/dev/null && wait "$GARAGE" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

GARAGE_BIN="$(command -v garage || echo "${CARGO_HOME:-$HOME/.cargo}/bin/garage")"
[ -x "$GARAGE_BIN" ] || { echo "garage not found: run hack/install-deps.sh --tests" >&2; exit 1; }
command -v s3cmd >/dev/null || { echo "s3cmd not found: run hack/install-deps.sh" >&2; exit 1; }
S3=$(free_port); RPC=$(free_port)
KEY_ID=GKhostletbench00000001; SECRET=hostlet-bench-secret-0123456789abcdef; BUCKET=bench
mkdir -p "$WORK/garage"
{
  echo "metadata_dir = \"$WORK/garage/meta\""
  echo "data_dir = \"$WORK/garage/data\""
  echo 'db_engine = "sqlite"'
  echo 'replication_factor = 1'
  echo "rpc_bind_addr = \"127.0.0.1:$RPC\""
  echo "rpc_public_addr = \"127.0.0.1:$RPC\""
  echo "rpc_secret = \"$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')\""
  echo '[s3_api]'
  echo 's3_region = "garage"'
  echo "api_bind_addr = \"127.0.0.1:$S3\""
  echo 'root_domain = ".s3.garage.localhost"'
} >"$WORK/garage/garage.toml"
GARAGE_DEFAULT_ACCESS_KEY=$KEY_ID GARAGE_DEFAULT_SECRET_KEY=$SECRET GARAGE_DEFAULT_BUCKET=$BUCKET RUST_LOG=garage=warn \
  "$GARAGE_BIN" -c "$WORK/garage/garage.toml" server --single-node --default-bucket >"$WORK/garage.log" 2>&1 &
GARAGE=$!
printf '[default]\naccess_key = %s\nsecret_key = %s\nhost_base = 127.0.0.1:%s\nhost_bucket = 127.0.0.1:%s\nbucket_location = garage\nuse_https = False\nsignature_v2 = False\n' \
  "$KEY_ID" "$SECRET" "$S3" "$S3" >"$WORK/s3cfg"
s3put() { s3cmd -c "$WORK/s3cfg" --no-progress put "$1" "s3://$BUCKET/$2" >/dev/null; }
deadline=$((SECONDS + 60))
until s3cmd -c "$WORK/s3cfg" ls "s3://$BUCKET" >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "garage not ready; log:" >&2; tail -20 "$WORK/garage.log" >&2; exit 1; }
  sleep 0.2
done

CLIENT=$(free_port); PEER=$(free_port); API=$(free_port); METRICS=$(free_port)
DATA="$WORK/node"
# Endpoint and credentials are set from the start; the bucket (which turns uploads on) comes later through
# the policy key, so that the first figures are of saves alone.
# The server is on loopback in plain HTTP, hence --snapshot-s3-allow-http.
start_agent() {
  AWS_ACCESS_KEY_ID=$KEY_ID AWS_SECRET_ACCESS_KEY=$SECRET \
    "$HOSTLET" run --data-dir "$DATA" --node-name bench --advertise-address 127.0.0.1 \
    --etcd-client-port "$CLIENT" --etcd-peer-port "$PEER" --listen "127.0.0.1:$API" \
    --metrics-listen "127.0.0.1:$METRICS" --snapshot-schedule "0 0 1 1 *" \
    --snapshot-s3-endpoint "http://127.0.0.1:$S3" --snapshot-s3-allow-http --snapshot-s3-region garage \
    --snapshot-s3-prefix bench "$@" >>"$WORK/agent.log" 2>&1 &
  AGENT=$!
  deadline=$((SECONDS + 120))
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$METRICS/readyz" || true)" = 200 ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "agent not ready; log:" >&2; tail -20 "$WORK/agent.log" >&2; exit 1; }
    sleep 0.1
  done
}
start_agent

TLS="$DATA/tls"
ctl() {
  ETCDCTL_API=3 etcdctl --endpoints "https://127.0.0.1:$CLIENT" --cacert "$TLS/ca.crt" \
    --cert "$TLS/client.crt" --key "$TLS/client.key" --command-timeout=60s "$@"
}

echo "filling etcd with ${DB_MB} MB (1 MB values: half random, half text)..." >&2
head -c 786432 /dev/urandom | base64 -w0 | head -c 1000000 >"$WORK/random.val" || true
yes "hostlet snapshot benchmark line of ordinary text" | head -c 1000000 >"$WORK/text.val" || true
for i in $(seq 1 "$DB_MB"); do
  if [ $((i % 2)) -eq 0 ]; then f="$WORK/random.val"; else f="$WORK/text.val"; fi
  ctl put "/bench/$i" <"$f" >/dev/null
done
db_bytes=$(ctl endpoint status -w json | sed -n 's/.*"dbSize":\([0-9]*\).*/\1/p' | head -1)
db_mb=$(awk -v b="$db_bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "database: ${db_mb} MB" >&2

hostlet_times=(); etcdctl_times=()
for r in $(seq 1 "$RUNS"); do
  t0=$(now); ctl snapshot save "$WORK/etcdctl-$r.db" >/dev/null; t1=$(now)
  etcdctl_times+=("$(elapsed "$t0" "$t1")")
  rm -f "$WORK/etcdctl-$r.db"
  t0=$(now); "$HOSTLET" etcd snapshot save --data-dir "$DATA" --name "bench-$r" >/dev/null 2>&1; t1=$(now)
  hostlet_times+=("$(elapsed "$t0" "$t1")")
  echo "run $r: etcdctl ${etcdctl_times[-1]} s, hostlet ${hostlet_times[-1]} s" >&2
done
etcdctl_s=$(printf '%s\n' "${etcdctl_times[@]}" | median)
hostlet_s=$(printf '%s\n' "${hostlet_times[@]}" | median)

ctl put /hostlet/config/snapshots '{"compress": true}' >/dev/null
sleep 1 # the agent applies policy changes from its watch
t0=$(now); "$HOSTLET" etcd snapshot save --data-dir "$DATA" --name bench-zst >/dev/null 2>&1; t1=$(now)
compressed_s=$(elapsed "$t0" "$t1")
zst=$(ls "$DATA"/db/snapshots/bench-zst-bench-*.zst 2>/dev/null | head -1)
compressed_mb=$(awk -v b="$(stat -c %s "$zst" 2>/dev/null || echo 0)" 'BEGIN { printf "%.1f", b / 1048576 }')
ratio=$(awk -v h="$hostlet_s" -v e="$etcdctl_s" 'BEGIN { printf "%.3f", h / e }')

# Upload figure: uploads on (plain files), then save + upload against etcdctl save + s3cmd put.
# Earlier saves are deleted first: turning uploads on would upload them, inside the timed runs.
for f in "$DATA"/db/snapshots/bench-*; do "$HOSTLET" etcd snapshot delete --data-dir "$DATA" "$(basename "$f")" >/dev/null; done
ctl put /hostlet/config/snapshots "{\"compress\": false, \"s3\": {\"bucket\": \"$BUCKET\"}}" >/dev/null
sleep 1 # the agent applies policy changes from its watch
up_times=(); base_times=()
for r in $(seq 1 "$RUNS"); do
  t0=$(now); ctl snapshot save "$WORK/etcdctl-up-$r.db" >/dev/null; s3put "$WORK/etcdctl-up-$r.db" "plain/etcdctl-up-$r.db"; t1=$(now)
  base_times+=("$(elapsed "$t0" "$t1")")
  rm -f "$WORK/etcdctl-up-$r.db"
  t0=$(now); "$HOSTLET" etcd snapshot save --data-dir "$DATA" --name "bench-up-$r" -o json >"$WORK/up-$r.json" 2>/dev/null; t1=$(now)
  up_times+=("$(elapsed "$t0" "$t1")")
  grep -q '"state": *"ok"' "$WORK/up-$r.json" || { echo "upload $r did not succeed:" >&2; cat "$WORK/up-$r.json" >&2; tail -20 "$WORK/agent.log" >&2; exit 1; }
  for f in "$DATA"/db/snapshots/bench-up-*; do "$HOSTLET" etcd snapshot delete --data-dir "$DATA" "$(basename "$f")" >/dev/null; done
  echo "upload run $r: etcdctl + s3cmd ${base_times[-1]} s, hostlet save + upload ${up_times[-1]} s" >&2
done
base_s=$(printf '%s\n' "${base_times[@]}" | median)
up_s=$(printf '%s\n' "${up_times[@]}" | median)
up_ratio=$(awk -v h="$up_s" -v e="$base_s" 'BEGIN { printf "%.3f", h / e }')

# Encrypted: the agent restarts with a key (uploads off while it does), then the same saves and uploads.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/snap.key"
chmod 600 "$WORK/snap.key"
ctl put /hostlet/config/snapshots '{"compress": false}' >/dev/null
kill -TERM "$AGENT"; wait "$AGENT" 2>/dev/null || true
start_agent --snapshot-encryption-key-file "$WORK/snap.key"
enc_times=()
for r in $(seq 1 "$RUNS"); do
  t0=$(now); "$HOSTLET" etcd snapshot save --data-dir "$DATA" --name "bench-enc-$r" >/dev/null 2>&1; t1=$(now)
  enc_times+=("$(elapsed "$t0" "$t1")")
  ls "$DATA"/db/snapshots/bench-enc-*.enc >/dev/null 2>&1 || { echo "encrypted save $r wrote no .enc file" >&2; exit 1; }
  for f in "$DATA"/db/snapshots/bench-enc-*; do "$HOSTLET" etcd snapshot delete --data-dir "$DATA" "$(basename "$f")" >/dev/null; done
  echo "encrypted run $r: hostlet ${enc_times[-1]} s" >&2
done
ctl put /hostlet/config/snapshots "{\"compress\": false, \"s3\": {\"bucket\": \"$BUCKET\"}}" >/dev/null
sleep 1 # the agent applies policy changes from its watch
enc_up_times=()
for r in $(seq 1 "$RUNS"); do
  t0=$(now); "$HOSTLET" etcd snapshot save --data-dir "$DATA" --name "bench-enc-up-$r" -o json >"$WORK/enc-up-$r.json" 2>/dev/null; t1=$(now)
  enc_up_times+=("$(elapsed "$t0" "$t1")")
  grep -q '"state": *"ok"' "$WORK/enc-up-$r.json" || { echo "encrypted upload $r did not succeed:" >&2; cat "$WORK/enc-up-$r.json" >&2; tail -20 "$WORK/agent.log" >&2; exit 1; }
  for f in "$DATA"/db/snapshots/bench-enc-up-*; do "$HOSTLET" etcd snapshot delete --data-dir "$DATA" "$(basename "$f")" >/dev/null; done
  echo "encrypted upload run $r: hostlet save + upload ${enc_up_times[-1]} s" >&2
done
enc_s=$(printf '%s\n' "${enc_times[@]}" | median)
enc_up_s=$(printf '%s\n' "${enc_up_times[@]}" | median)
enc_ratio=$(awk -v h="$enc_s" -v e="$hostlet_s" 'BEGIN { printf "%.3f", h / e }')
enc_up_ratio=$(awk -v h="$enc_up_s" -v e="$up_s" 'BEGIN { printf "%.3f", h / e }')

echo
echo "db ${db_mb} MB; median of ${RUNS}: hostlet ${hostlet_s} s, etcdctl ${etcdctl_s} s (baseline), ratio ${ratio} (target <= 1.1)"
echo "compressed: ${compressed_s} s, ${compressed_mb} MB on disk"
echo "upload, median of ${RUNS}: hostlet save + upload ${up_s} s, etcdctl save + s3cmd put ${base_s} s (baseline), ratio ${up_ratio} (target <= 1.2)"
echo "encrypted, median of ${RUNS}: save ${enc_s} s against ${hostlet_s} s plain, ratio ${enc_ratio}; save + upload ${enc_up_s} s against ${up_s} s plain, ratio ${enc_up_ratio} (target <= 1.15)"
printf '{"bench":"snapshot","db_mb":%s,"hostlet_s":%s,"etcdctl_s":%s,"ratio":%s,"compressed_s":%s,"compressed_mb":%s,"upload_s":%s,"upload_baseline_s":%s,"upload_ratio":%s,"encrypted_s":%s,"encrypted_ratio":%s,"encrypted_upload_s":%s,"encrypted_upload_ratio":%s}\n' \
  "$db_mb" "$hostlet_s" "$etcdctl_s" "$ratio" "$compressed_s" "$compressed_mb" "$up_s" "$base_s" "$up_ratio" \
  "$enc_s" "$enc_ratio" "$enc_up_s" "$enc_up_ratio"
