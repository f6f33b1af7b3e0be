#!/usr/bin/env bash
# Builds local images from files on this machine: there is no registry to pull from. Idempotent: an image
# whose label io.hostlet.image-source matches the hash of what it is built from is left as it is.
#   hack/images.sh                          busybox:latest: FROM scratch + /bin/busybox with its applets linked
#                                           (sh, httpd, cat, mkfifo, …): the tests' image and the pods' infra image
#   hack/images.sh hostlet [BINARY [TAG]]   the agent's image (deploy/Dockerfile) from BINARY (default
#                                           target/release/hostlet) and this machine's etcd and etcdctl, with
#                                           exactly the shared libraries ldd lists for them; TAG defaults to
#                                           hostlet:latest. BASE=scratch (default) or BASE=debian:12-slim where a
#                                           registry can be reached (then the base's own libraries are used).
# Skips (exit 0) when no Docker engine is reachable.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "images.sh: no Docker engine reachable; skipped building local images"
  exit 0
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

# label_of TAG: the image's io.hostlet.image-source label, empty when there is no such image.
label_of() { docker image inspect -f '{{ index .Config.Labels "io.hostlet.image-source" }}' "$1" 2>/dev/null || true; }

build() { # build TAG HASH [docker build flags…]: the context is $ctx
  local tag=$1 hash=$2
  shift 2
  if ! DOCKER_BUILDKIT=0 docker build -q --label "io.hostlet.image-source=$hash" -t "$tag" "$@" "$ctx" >"$ctx/build.log" 2>&1; then
    cat "$ctx/build.log" >&2
    exit 1
  fi
}

is_static() { [ -x "$1" ] && case "$(ldd "$1" 2>&1 || true)" in *"not a dynamic executable"*|*"statically linked"*) true ;; *) false ;; esac; }

busybox_image() {
  local busybox_bin=""
  for cand in /bin/busybox /usr/bin/busybox; do
    if is_static "$cand"; then busybox_bin=$cand; break; fi
  done
  if [ -z "$busybox_bin" ]; then
    echo "images.sh: no statically linked busybox found; install busybox-static (hack/install-deps.sh)" >&2
    exit 1
  fi
  cp "$busybox_bin" "$ctx/busybox"
  cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/mkdir", "-p", "/tmp", "/var/www", "/etc", "/root"]
RUN ["/bin/sh", "-c", "echo 'root:x:0:0:root:/root:/bin/sh' > /etc/passwd && echo 'root:x:0:' > /etc/group && chmod 1777 /tmp"]
ENV PATH=/bin
CMD ["/bin/sh"]
DOCKERFILE
  local want
  want=$(cat "$ctx/busybox" "$ctx/Dockerfile" | sha256sum | cut -c1-16)
  if [ "$(label_of busybox:latest)" = "$want" ]; then
    echo "images.sh: busybox:latest is up to date"
    return
  fi
  build busybox:latest "$want"
  echo "images.sh: built busybox:latest from $busybox_bin"
}

# libs_of BINARY…: the absolute paths of the shared libraries (and the loader) the binaries load, one a line.
libs_of() {
  local out
  for bin in "$@"; do
    out=$(ldd "$bin" 2>&1) || { is_static "$bin" && continue; echo "images.sh: ldd $bin: $out" >&2; exit 1; }
    if grep -q "not found" <<<"$out"; then
      echo "images.sh: $bin needs libraries this machine lacks:" >&2
      grep "not found" <<<"$out" >&2
      exit 1
    fi
    # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and "/lib64/ld-linux-x86-64.so.2 (0x…)"
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"
  done | sort -u
}

hostlet_image() {
  local bin=${1:-${CARGO_TARGET_DIR:-$repo/target}/release/hostlet} tag=${2:-hostlet:latest} base=${BASE:-scratch}
  if [ ! -x "$bin" ]; then
    echo "images.sh: $bin: no such executable; build it first (cargo build --release --bin hostlet)" >&2
    exit 1
  fi
  local etcd etcdctl
  if ! etcd=$(command -v etcd) || ! etcdctl=$(command -v etcdctl); then
    echo "images.sh: etcd and etcdctl not found; install etcd-server and etcd-client (hack/install-deps.sh)" >&2
    exit 1
  fi
  local libs=()
  if [ "$base" = scratch ]; then mapfile -t libs < <(libs_of "$bin" "$etcd" "$etcdctl"); fi
  # The hash covers every input: binaries, libraries, the Dockerfile and the base.
  local want
  want=$( { printf '%s\n' "$base" "${libs[@]}"; cat "$bin" "$etcd" "$etcdctl" "$repo/deploy/Dockerfile"; \
            for l in "${libs[@]}"; do cat "$l"; done; } | sha256sum | cut -c1-16)
  if [ "$(label_of "$tag")" = "$want" ]; then
    echo "images.sh: $tag is up to date"
    return
  fi
  mkdir -p "$ctx/bin" "$ctx/rootfs/var/lib/hostlet"
  cp "$bin" "$ctx/bin/hostlet"
  cp "$etcd" "$ctx/bin/etcd"
  cp "$etcdctl" "$ctx/bin/etcdctl"
  chmod 0755 "$ctx/bin/"*
  if [ "$base" = scratch ]; then
    mkdir -p "$ctx/rootfs/etc" "$ctx/rootfs/tmp"
    for l in "${libs[@]}"; do
      mkdir -p "$ctx/rootfs$(dirname "$l")"
      cp -L "$l" "$ctx/rootfs$l"
    done
    # Users the agent may run as (root, or a non-root user in the Docker socket's group), and name lookups
    # from /etc/hosts first, as on the host.
    printf 'root:x:0:0:root:/root:/sbin/nologin\nhostlet:x:65532:65532:hostlet:/var/lib/hostlet:/sbin/nologin\n' >"$ctx/rootfs/etc/passwd"
    printf 'root:x:0:\nhostlet:x:65532:\n' >"$ctx/rootfs/etc/group"
    printf 'hosts: files dns\n' >"$ctx/rootfs/etc/nsswitch.conf"
    chmod 1777 "$ctx/rootfs/tmp"
  fi
  cp "$repo/deploy/Dockerfile" "$ctx/Dockerfile"
  build "$tag" "$want" --build-arg "BASE=$base"
  echo "images.sh: built $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{ printf "%.1f MB", $1 / 1e6 }')) from $bin, $etcd, $etcdctl on $base"
}

case "${1:-busybox}" in
  busybox) busybox_image ;;
  hostlet) shift; hostlet_image "$@" ;;
  *) echo "usage: hack/images.sh [busybox | hostlet [BINARY [TAG]]]" >&2; exit 2 ;;
esac
