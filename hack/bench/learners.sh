#!/usr/bin/env bash
# Learner start → voter with the learner manager, at 0/60/200 MB, beside a bare promote-retry loop
#
# Run through `hack/bench.sh learners`. For each size: a fresh one-member cluster with the data, a learner
# added and started; the time from its etcd's start until it is a voter, with the learner manager doing the
# promoting, beside the floor — a bare loop retrying `member promote` every 5 ms on an identical cluster in
# the same run (the earliest moment etcd accepts). Medians of RUNS (3). Environment: RUNS, SIZES_MB
# ("0,60,200"). Needs /usr/bin/etcd (or HOSTLET_TEST_ETCD). Nothing is asserted; the last line is one JSON
# object.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec cargo run --release --quiet -p hostlet-controllers --example bench_learners -- "$@"
