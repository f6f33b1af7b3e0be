#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/*.rs) for a fixed time each: first over its kept regression
# inputs (fuzz/regressions/<target>/: inputs that once crashed it, kept so they never do again), then on
# new inputs. A crash fails the run; libFuzzer leaves the input in fuzz/artifacts/<target>/.
#
#   hack/fuzz.sh [SECONDS] [TARGET...]     default: 20 s each, every target
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../fuzz"

seconds="${1:-20}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

if ! rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
    # cargo-fuzz needs nightly's sanitizer support; a machine without it cannot fuzz at all.
    echo "hack/fuzz.sh: SKIPPED, no nightly Rust toolchain on this machine (rustup toolchain install nightly)" >&2
    exit 0
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cargo +nightly fuzz build >"$log" 2>&1; then
    cat "$log" >&2
    echo "fuzz: the targets do not build" >&2
    exit 1
fi
for t in "${targets[@]}"; do
    corpus="$(mktemp -d)"
    mkdir -p "regressions/$t"
    echo "fuzz: $t for ${seconds}s ($(find "regressions/$t" -type f | wc -l) regression inputs)"
    # The regression inputs are read (second corpus dir), and a target's seeds and dictionary where it has
    # them (the manifest parser starts from the example manifests of tests/manifests); new inputs go to the
    # scratch corpus only.
    read_dirs=("regressions/$t")
    extra=()
    if [ "$t" = parse_validate ]; then read_dirs+=("../tests/manifests"); fi
    if [ -f "dicts/$t.dict" ]; then extra+=("-dict=dicts/$t.dict"); fi
    status=0
    cargo +nightly fuzz run "$t" "$corpus" "${read_dirs[@]}" -- \
        -max_total_time="$seconds" "${extra[@]}" >"$log" 2>&1 || status=$?
    rm -rf "$corpus"
    grep -E "DONE|stat::number_of_executed_units" "$log" | tail -1 || true
    if [ "$status" -ne 0 ]; then
        tail -60 "$log" >&2
        echo "fuzz: $t FAILED (input kept under fuzz/artifacts/$t/; add it to fuzz/regressions/$t/ once fixed)" >&2
        exit 1
    fi
done
echo "fuzz: every target ran ${seconds}s without a crash"
