#!/usr/bin/env bash
# Builds the local test images from Debian's busybox-static: there is no registry to pull from.
#   busybox:latest  FROM scratch + /bin/busybox with its applets linked (sh, httpd, cat, mkfifo, …)
# Skips (exit 0) when no Docker engine is reachable.
set -euo pipefail

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "images.sh: no Docker engine reachable; skipped building local images"
  exit 0
fi

is_static() { [ -x "$1" ] && case "$(ldd "$1" 2>&1 || true)" in *"not a dynamic executable"*|*"statically linked"*) true ;; *) false ;; esac; }
busybox_bin=""
for cand in /bin/busybox /usr/bin/busybox; do
  if is_static "$cand"; then busybox_bin=$cand; break; fi
done
if [ -z "$busybox_bin" ]; then
  echo "images.sh: no statically linked busybox found; install busybox-static (hack/install-deps.sh)" >&2
  exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
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

want=$(cat "$ctx/busybox" "$ctx/Dockerfile" | sha256sum | cut -c1-16)
have=$(docker image inspect -f '{{ index .Config.Labels "io.hostlet.image-source" }}' busybox:latest 2>/dev/null || true)
if [ "$have" = "$want" ]; then
  echo "images.sh: busybox:latest is up to date"
  exit 0
fi
echo "LABEL io.hostlet.image-source=$want" >> "$ctx/Dockerfile"
if ! DOCKER_BUILDKIT=0 docker build -q -t busybox:latest "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
echo "images.sh: built busybox:latest from $busybox_bin"
