#!/usr/bin/env bash
# etcd informer into its store vs a bare etcd-client watch: events/s and put-to-visible latency
#
# Environment: KEYS (50000), BATCH (puts per transaction, 100), WRITERS (2), ROUNDS (3).
# Needs /usr/bin/etcd (or HOSTLET_TEST_ETCD); the benchmark starts its own member on free ports.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec cargo run --release --quiet -p hostlet-runtime --features testkit --example bench_informer -- "$@"
