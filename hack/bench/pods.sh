#!/usr/bin/env bash
# pod controller vs direct Docker API: 50 pods put at once (p50/p99 put→running, all running), then idle cost
#
# Environment: PODS (50), IDLE_SECS (60), CONCURRENCY (pods started at once, both sides: 8).
# Needs the Docker engine and busybox:latest (hack/images.sh), and /usr/bin/etcd; starts its own etcd member.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash hack/images.sh >/dev/null
exec cargo run --release --quiet -p hostlet-controllers --example bench_pods -- "$@"
