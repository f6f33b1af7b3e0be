#!/usr/bin/env bash
# Runs benchmark NAME against a real etcd (and Docker, for those that need it) and prints its figures beside
# the baseline measured in the same run. The last line of the output is one JSON object with `bench` and
# the figures. Nothing is asserted.
#
#   hack/bench.sh NAME [ARGS...]     run one benchmark
#   hack/bench.sh --list             list the benchmarks
#
# Each benchmark is a script hack/bench/NAME.sh; add a benchmark by adding a script there.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."

list() {
    for f in "$here"/bench/*.sh; do
        [ -e "$f" ] || continue
        name="$(basename "$f" .sh)"
        # The script's second line is its one-line description.
        printf '  %-16s %s\n' "$name" "$(sed -n '2s/^# *//p' "$f")"
    done
}

usage() {
    echo "usage: hack/bench.sh NAME [ARGS...]"
    echo "benchmarks:"
    list
}

name="${1:-}"
case "$name" in
    "" | -h | --help) usage; exit 0 ;;
    --list) list; exit 0 ;;
esac
shift

if [[ ! "$name" =~ ^[a-z0-9_-]+$ ]] || [ ! -f "$here/bench/$name.sh" ]; then
    echo "hack/bench.sh: unknown benchmark '$name'" >&2
    usage >&2
    exit 2
fi
exec bash "$here/bench/$name.sh" "$@"
