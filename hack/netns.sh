#!/usr/bin/env bash
# Hosts in network namespaces by hand, as tests/netns_support makes them for the fault tests (root only).
#   hack/netns.sh up N            N namespaces hl<k>-man-1..N on bridge hlbr<k>, subnet 10.<200+k/256>.<k%256>.0/24;
#                                 prints the slot k and each namespace's address
#   hack/netns.sh start K I [FLAGS…]  hostlet run in namespace I of slot K (data in /tmp/hl<K>-man-<I>, default
#                                 ports, log in that dir); host 1 founds, give --server/--token to the others
#   hack/netns.sh partition K I   drop every packet in and out of host I (nftables inside its namespace)
#   hack/netns.sh loss K I PCT    drop PCT % of its packets;   hack/netns.sh heal K I   take the fault off
#   hack/netns.sh down K          kill what runs in the namespaces, remove them, the bridge and the rule
# Slots are claimed under /run/hostlet-netns like the tests' own, so they never collide with a test run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
locks=/run/hostlet-netns
bin=${HOSTLET_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/hostlet}
[ "$(id -u)" = 0 ] || { echo "netns.sh: network namespaces need root" >&2; exit 1; }

prefix() { echo "10.$((200 + $1 / 256)).$(($1 % 256))"; }
ns() { echo "hl$1-man-$2"; }
rule() { echo "FORWARD -i hlbr$1 -o hlbr$1 -m comment --comment hostlet-netns-$1 -j ACCEPT"; }

case "${1:-}" in
  up)
    n=${2:?N}
    mkdir -p "$locks"
    for k in $(seq 4095 -1 0); do
      p=$(prefix "$k")
      ip -4 route show table all | grep "^\(local \|broadcast \)\?$p\." >/dev/null && continue
      mkdir "$locks/$k" 2>/dev/null || continue
      echo $$ >"$locks/$k/owner"; echo manual >"$locks/$k/manual"
      break
    done
    ip link add "hlbr$k" type bridge
    ip addr add "$p.254/24" dev "hlbr$k"
    ip link set "hlbr$k" up
    # shellcheck disable=SC2046
    iptables -I $(rule "$k" | sed 's/^FORWARD/FORWARD 1/')
    for i in $(seq 1 "$n"); do
      ip netns add "$(ns "$k" "$i")"
      ip link add "hl${k}h$i" type veth peer name "hl${k}n$i"
      ip link set "hl${k}n$i" netns "$(ns "$k" "$i")"
      ip -n "$(ns "$k" "$i")" link set "hl${k}n$i" name eth0
      ip -n "$(ns "$k" "$i")" addr add "$p.$i/24" dev eth0
      ip -n "$(ns "$k" "$i")" link set eth0 up
      ip -n "$(ns "$k" "$i")" link set lo up
      ip link set "hl${k}h$i" master "hlbr$k" up
      echo "host $i: namespace $(ns "$k" "$i"), address $p.$i"
    done
    echo "slot $k (hack/netns.sh down $k removes it all)"
    ;;
  start)
    k=${2:?K}; i=${3:?I}; shift 3
    dir=/tmp/$(ns "$k" "$i"); mkdir -p "$dir"
    a=$(prefix "$k").$i
    ip netns exec "$(ns "$k" "$i")" "$bin" run --node-name "$(ns "$k" "$i")" --data-dir "$dir/data" \
      --advertise-address "$a" --listen "$a:10250" --metrics-listen "$a:10249" "$@" >"$dir/hostlet.log" 2>&1 &
    echo "started: pid $!, log $dir/hostlet.log, API https://$a:10250, metrics http://$a:10249/metrics"
    ;;
  partition|loss)
    k=${2:?K}; i=${3:?I}
    cond=""; [ "$1" = loss ] && cond="numgen random mod 100 < ${4:?PCT} "
    ip netns exec "$(ns "$k" "$i")" nft -f - <<EOF
table inet hostlet_fault {
  chain input { type filter hook input priority -10; policy accept; iifname "eth0" ${cond}drop; }
  chain output { type filter hook output priority -10; policy accept; oifname "eth0" ${cond}drop; }
}
EOF
    ;;
  heal)
    ip netns exec "$(ns "${2:?K}" "${3:?I}")" nft delete table inet hostlet_fault 2>/dev/null || true
    ;;
  down)
    k=${2:?K}
    for n in $(ip netns list | awk '{print $1}' | grep "^hl$k-" || true); do
      for pid in $(ip netns pids "$n"); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$n"
    done
    # The kernel may keep a deleted namespace (and its veth) a while after its sockets close.
    for l in $(ip -o link show | grep -o "hl${k}h[0-9]*" | sort -u); do ip link del "$l" 2>/dev/null || true; done
    ip link del "hlbr$k" 2>/dev/null || true
    # shellcheck disable=SC2046
    while iptables -D $(rule "$k") 2>/dev/null; do :; done
    rm -rf "${locks:?}/$k"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
