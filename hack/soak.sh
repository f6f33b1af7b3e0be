#!/usr/bin/env bash
# Random faults on three hosts in network namespaces for SECONDS (default 600), from a seed printed at the
# start (SEED=… replays a run): partitions, lossy or slow links, paused etcds, SIGKILLs of agents and etcds,
# during rejoins and snapshots, full disks (a tmpfs under each host's data dir, filled then freed) and Docker
# outages (the agent's Docker proxy socket cut, then restored). One row per fault: fault, hosts, time to
# converge, invariants held; the run fails at the first broken invariant. Root only (network namespaces,
# mounts). `make soak SECONDS=…` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_SECONDS=${SECONDS_TO_RUN:-${1:-600}}
[ -n "${SEED:-}" ] && export SEED
exec cargo test --test faults_netns -- --ignored --exact soak --nocapture --test-threads 1
