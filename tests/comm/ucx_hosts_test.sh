#!/usr/bin/env bash
# Host-memory collectives between "hosts" over the ucx backend (LOOM_NET=ucx: UCX's UCP,
# real UCX, no emulation). Each process claims a host of its own (LOOM_HOST_ID), so every
# pair of ranks goes over net/ucx.
#   loopback N  N processes on this machine; UCX_TLS as the caller set it (UCX then
#               picks shared memory between them), or `tcp` as the third argument
#   netns       two network namespaces with two ranks each, UCX_TLS=tcp (needs root and
#               `ip netns`, else exit 77: skipped): the pairs inside a namespace use shm,
#               the others net/ucx over TCP across the veth link, in 4 lanes (host
#               buffers take 1 by default) so that striping runs between processes too,
#               with socket buffers of at most 32 KiB
#   kill        three hosts check all-reduces in a loop and the third is killed (kill -9)
#               after a second and a half: the other two must fail within 15 s with a
#               message that names it
# Usage: ucx_hosts_test.sh PATH/TO/loom_rank_check (loopback N [tcp] | netns | kill)
set -uo pipefail
check="$1" mode="${2:-loopback}" n="${3:-2}" tls="${4:-}"
tag="loomucx$$"
logs="${TMPDIR:-/tmp}/$tag"
mkdir -p "$logs"
common=(env LOOM_NET=ucx LOOM_TIMEOUT_MS=30000 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=INIT,NET)
[[ -n "$tls" ]] && common+=(UCX_TLS="$tls")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [[ "$mode" == netns ]] && { ip netns del "${tag}a" 2>/dev/null; ip netns del "${tag}b" 2>/dev/null; }
  [[ -n "${LOOM_KEEP_LOGS:-}" ]] || rm -rf "$logs"
}
trap cleanup EXIT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../scripts/lib/ports.sh"
source "$here/../../scripts/lib/host_tests.sh"
port=$(loom_free_port)
if [[ "$mode" == netns ]]; then
  if [[ $(id -u) -ne 0 ]]; then echo "SKIP: network namespaces need root"; exit 77; fi
  if ! command -v ip >/dev/null; then echo "SKIP: no 'ip' command (iproute2)"; exit 77; fi
  a="${tag}a" b="${tag}b"
  if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null; then
    echo "SKIP: 'ip netns add' refused here"; exit 77
  fi
  # Made here and then moved: UCX 1.13's tcp transport does not list a veth that was
  # made inside its namespace with its peer in another.
  ip link add "v${tag}a" type veth peer name "v${tag}b" || { echo "SKIP: veth refused"; exit 77; }
  ip link set "v${tag}a" netns "$a"
  ip link set "v${tag}b" netns "$b"
  ip -n "$a" addr add 198.51.100.1/24 dev "v${tag}a"
  ip -n "$b" addr add 198.51.100.2/24 dev "v${tag}b"
  # Socket buffers of at most 32 KiB: a socket then takes only part of a 256 KiB segment
  # that UCX has finished sending on its side, and the rest moves only while the worker is
  # progressed after the sender's last test (a lane lost a part in every run so until the
  # lanes kept moving on their own; 1 run in 16 with the defaults, under load).
  for ns in "$a" "$b"; do
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_wmem="4096 16384 32768" \
      net.ipv4.tcp_rmem="4096 16384 32768" || { echo "SKIP: sysctl refused"; exit 77; }
  done
  ip -n "$a" link set "v${tag}a" up
  ip -n "$b" link set "v${tag}b" up
  # UCX lists only interfaces that are running: wait for the carrier (at most 2 s).
  for _ in $(seq 20); do
    [[ $(ip netns exec "$b" cat "/sys/class/net/v${tag}b/operstate") == up ]] && break
    sleep 0.1
  done
  n=4
  for r in 0 1 2 3; do
    if (( r < 2 )); then ns="$a"; host=hostA; dev="v${tag}a"; else ns="$b"; host=hostB; dev="v${tag}b"; fi
    ip netns exec "$ns" "${common[@]}" UCX_TLS=tcp UCX_NET_DEVICES="$dev" LOOM_UCX_LANES=4 \
      LOOM_COMM_ID="198.51.100.1:$port" LOOM_NRANKS=4 LOOM_RANK=$r LOOM_HOST_ID=$host \
      "$check" > "$logs/$r.log" 2>&1 &
    pids+=($!)
  done
elif [[ "$mode" == kill ]]; then
  loom_hosts_kill "$check" "$logs" "$port" "${common[@]:1}"
  exit $?
else
  loom_hosts_start "$check" "$logs" "$port" "$n" "${common[@]:1}"
fi
rc=0
loom_hosts_wait "$logs" "$n" || rc=1
grep -h "connected to rank" "$logs"/*.log | sed 's/.*loom INFO //' | sort | uniq -c
grep -q "connected to rank .* via net/ucx" "$logs"/*.log || { echo "no net/ucx connection seen"; rc=1; }
grep -h "net/ucx: UCX" "$logs"/*.log | sed 's/.*loom INFO //' | sort -u
if [[ "$mode" == netns ]]; then
  grep -q "connected to rank .* via shm" "$logs"/*.log || { echo "no shm connection seen"; rc=1; }
fi
exit $rc
