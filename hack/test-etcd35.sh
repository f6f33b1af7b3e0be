#!/usr/bin/env bash
# The member, learner, snapshot, reset and upkeep tests once more, against etcd 3.5 (`make test` runs this after
# the whole suite ran against the distribution's etcd 3.4). HOSTLET_TEST_ETCD_DIR names the release's directory
# (etcd, etcdctl, etcdutl); hack/install-deps.sh --tests puts 3.5.1 in /opt/hostlet-test/etcd-3.5.1.
# A missing install fails this step: a run meant for 3.5 never falls back to another etcd.
# Extra arguments go to cargo nextest (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${HOSTLET_TEST_ETCD_DIR:-/opt/hostlet-test/etcd-3.5.1}"
for b in etcd etcdctl etcdutl; do
  if [ ! -x "$dir/$b" ]; then
    echo "test-etcd35: $dir/$b is missing (run hack/install-deps.sh --tests)" >&2
    exit 1
  fi
done
# sed reads to the end: `head -1` would close the pipe early and, under pipefail, fail this step on SIGPIPE.
version="$("$dir/etcd" --version | sed -n 1p)"
case "$version" in
  "etcd Version: 3.5."*) ;;
  *) echo "test-etcd35: $dir/etcd is not a 3.5 release ($version)" >&2; exit 1 ;;
esac
echo "test-etcd35: $version from $dir"
tests=(member_errors member_external member_join member_single learners_hostlets snapshots_agent
  tombstone_reset reset_refusals upkeep_agents learners_etcd snapshots_take)
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
start=$(date +%s)
HOSTLET_TEST_ETCD_DIR="$dir" cargo nextest run --workspace --all-features --no-fail-fast "${args[@]}" "$@"
echo "test-etcd35: done in $(( $(date +%s) - start )) s"
