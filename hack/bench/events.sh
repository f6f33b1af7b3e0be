#!/usr/bin/env bash
# event flood: 10,000 identical and 10,000 distinct failures through the recorder vs one key per event
#
# Environment: EVENTS (10000). Needs /usr/bin/etcd; starts its own member on free ports.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec cargo run --release --quiet -p hostlet-controllers --example bench_events -- "$@"
