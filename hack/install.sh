#!/usr/bin/env bash
# Installs hostlet on this host as a systemd service, or removes it. Idempotent: what is already in place
# is left alone (and said so).
#
#   hack/install.sh [--binary PATH] [--root DIR] [--dry-run]       install (make install)
#   hack/install.sh --uninstall [--purge] [--root DIR] [--dry-run]  remove; --purge also removes
#                                                                   /etc/default/hostlet and /var/lib/hostlet
#
# Install: the binary to /usr/local/bin/hostlet (default target/release/hostlet), deploy/hostlet.service to
# /etc/systemd/system (enabled), /etc/default/hostlet with every setting commented out (only when there is
# none: an edited one is kept), /var/lib/hostlet (0700), and Debian's etcd.service masked: hostlet runs
# etcd itself. Where systemd runs (and --root is /), systemd is reloaded and etcd.service stopped; hostlet
# is not started: set /etc/default/hostlet first on every node but the first, then
# `systemctl start hostlet`.
# --root DIR installs into DIR instead of / (a package build, a test). --dry-run prints what would be done
# and changes nothing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

binary=${CARGO_TARGET_DIR:-$repo/target}/release/hostlet
root=/
dry=0
mode=install
purge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift ;;
    --binary=*) binary=${1#*=} ;;
    --root) root=${2:?--root needs a directory}; shift ;;
    --root=*) root=${1#*=} ;;
    --dry-run) dry=1 ;;
    --uninstall) mode=uninstall ;;
    --purge) purge=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$purge" = 1 ] && [ "$mode" != uninstall ]; then
  echo "install.sh: --purge goes with --uninstall" >&2
  exit 2
fi
root=${root%/}
unitdir=/etc/systemd/system
# Live systemd only when installing onto this very host and systemd is PID 1.
live=0
if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then live=1; fi

# act CMD…: print it, run it unless --dry-run.
act() {
  if [ "$dry" = 1 ]; then echo "would: $*"; else echo "+ $*"; "$@"; fi
}
ok() { echo "ok: $*"; }

# put SRC DEST MODE: copy SRC to DEST unless DEST holds the same bytes and mode already.
changed=0
put() {
  local src=$1 dest=$root$2 mode=$3
  if cmp -s "$src" "$dest" && [ "$(stat -c %a "$dest")" = "${mode#0}" ]; then
    ok "$2 is up to date"
    return
  fi
  changed=1
  act install -D -m "$mode" "$src" "$dest"
}

# link TARGET NAME: NAME a symlink to TARGET (how systemctl masks and enables).
link() {
  local target=$1 name=$root$2
  if [ "$(readlink "$name" 2>/dev/null || true)" = "$target" ]; then
    ok "$2 → $target"
    return
  fi
  if [ -e "$name" ] && ! [ -L "$name" ]; then
    echo "install.sh: $2 exists and is not a link; move it away first" >&2
    exit 1
  fi
  changed=1
  if ! [ -d "$(dirname "$name")" ]; then act mkdir -p "$(dirname "$name")"; fi
  act ln -sfn "$target" "$name"
}

# remove PATH…: delete what exists.
remove() {
  local p
  for p in "$@"; do
    if [ -e "$root$p" ] || [ -L "$root$p" ]; then act rm -rf "$root$p"; else ok "$p is not there"; fi
  done
}

install_hostlet() {
  if [ ! -x "$binary" ]; then
    echo "install.sh: $binary: no such executable; build it first (cargo build --release --bin hostlet, or make install)" >&2
    exit 1
  fi
  put "$binary" /usr/local/bin/hostlet 0755
  put "$repo/deploy/hostlet.service" $unitdir/hostlet.service 0644
  if [ -e "$root/etc/default/hostlet" ]; then
    ok "/etc/default/hostlet exists (kept as it is)"
  else
    act install -D -m 0600 "$repo/deploy/hostlet.default" "$root/etc/default/hostlet"
  fi
  if [ -d "$root/var/lib/hostlet" ]; then
    ok "/var/lib/hostlet exists"
  else
    act install -d -m 0700 "$root/var/lib/hostlet"
  fi
  link /dev/null $unitdir/etcd.service
  link $unitdir/hostlet.service $unitdir/multi-user.target.wants/hostlet.service
  if [ "$live" = 1 ]; then
    act systemctl daemon-reload
    if systemctl is-active --quiet etcd.service; then act systemctl stop etcd.service; fi
    if [ "$changed" = 1 ] && systemctl is-active --quiet hostlet.service; then
      echo "hostlet is running the previous version: systemctl restart hostlet"
    fi
  fi
  if [ "$dry" = 1 ]; then return; fi
  echo "installed. Next: edit /etc/default/hostlet (every node but the first: HOSTLET_SERVER, HOSTLET_TOKEN_FILE), then systemctl start hostlet"
}

uninstall_hostlet() {
  if [ "$live" = 1 ] && systemctl is-active --quiet hostlet.service; then
    act systemctl stop hostlet.service
  fi
  remove $unitdir/multi-user.target.wants/hostlet.service $unitdir/hostlet.service /usr/local/bin/hostlet
  # The mask this installer set; a unit file of the admin's own in its place is not ours to delete.
  if [ "$(readlink "$root$unitdir/etcd.service" 2>/dev/null || true)" = /dev/null ]; then
    act rm -f "$root$unitdir/etcd.service"
  fi
  if [ "$purge" = 1 ]; then
    remove /etc/default/hostlet /var/lib/hostlet
  else
    for p in /etc/default/hostlet /var/lib/hostlet; do
      if [ -e "$root$p" ]; then echo "kept: $p (--purge removes it)"; fi
    done
  fi
  if [ "$live" = 1 ]; then act systemctl daemon-reload; fi
  if [ "$dry" = 1 ]; then return; fi
  echo "uninstalled"
}

if [ "$dry" = 1 ]; then echo "dry run: nothing is changed"; fi
"${mode}_hostlet"
