#!/usr/bin/env bash
# Host-memory collectives between "hosts" over the ib backend on the emulated RDMA devices
# (LOOM_IB_EMULATE=roce: an emulation, transports/net/ib/emulator.h; no RDMA hardware
# here). Each process claims a host of its own (LOOM_HOST_ID), so every pair of ranks
# goes over net/ib; with `netns`, two network namespaces with two ranks each (needs root
# and `ip netns`, else exit 77: skipped), so the pairs inside a namespace use shm and the
# others net/ib across the veth link, each side with its own GIDs.
# With `kill`, three hosts check all-reduces in a loop and the third is killed (kill -9)
# after a second: the other two must fail within 15 s with a message that names it.
# With `cut`, two namespaces with a rank each check all-reduces in a loop and the second
# namespace's veth goes down after a second and a half: its peer must fail within
# LOOM_TIMEOUT_MS (4 s here) with a message that names it. (The emulated devices still
# reach each other; what is tested is that a cut-off host is noticed with no work request
# of one's own to fail: the watching socket's keepalive.)
# With `mismatch`, the second of two hosts leaves the net transport out (as a host
# without an RDMA device would have it): both must fail at once, saying so.
# Usage: ib_hosts_test.sh PATH/TO/loom_rank_check (loopback NRANKS | netns | kill | cut |
#        mismatch)
set -uo pipefail
check="$1" mode="${2:-loopback}" n="${3:-2}"
tag="loomib$$"
logs="${TMPDIR:-/tmp}/$tag"
mkdir -p "$logs"
emu="$logs/fabric"  # the emulated fabric's sockets
common=(env LOOM_NET=ib LOOM_IB_EMULATE=roce LOOM_TIMEOUT_MS=30000 LOOM_DEBUG=INFO
  LOOM_DEBUG_SUBSYS=INIT,NET TMPDIR="$emu")
mkdir -p "$emu"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [[ "$mode" == netns || "$mode" == cut ]] &&
    { ip netns del "${tag}a" 2>/dev/null; ip netns del "${tag}b" 2>/dev/null; }
  [[ -n "${LOOM_KEEP_LOGS:-}" ]] || rm -rf "$logs"
}
trap cleanup EXIT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../scripts/lib/ports.sh"
source "$here/../../scripts/lib/host_tests.sh"
port=$(loom_free_port)
if [[ "$mode" == netns || "$mode" == cut ]]; then
  if [[ $(id -u) -ne 0 ]]; then echo "SKIP: network namespaces need root"; exit 77; fi
  if ! command -v ip >/dev/null; then echo "SKIP: no 'ip' command (iproute2)"; exit 77; fi
  a="${tag}a" b="${tag}b"
  if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null; then
    echo "SKIP: 'ip netns add' refused here"; exit 77
  fi
  ip link add "v${tag}a" netns "$a" type veth peer name "v${tag}b" netns "$b" ||
    { echo "SKIP: veth refused"; exit 77; }
  ip -n "$a" addr add 198.51.100.1/24 dev "v${tag}a"
  ip -n "$b" addr add 198.51.100.2/24 dev "v${tag}b"
  for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
  ip -n "$a" link set "v${tag}a" up
  ip -n "$b" link set "v${tag}b" up
fi
if [[ "$mode" == cut ]]; then
  start=$(date +%s)
  for r in 0 1; do
    if (( r == 0 )); then ns="$a"; else ns="$b"; fi
    ip netns exec "$ns" "${common[@]}" LOOM_TIMEOUT_MS=4000 LOOM_COMM_ID="198.51.100.1:$port" \
      LOOM_NRANKS=2 LOOM_RANK=$r LOOM_HOST_ID="host$r" "$check" --loop 20 > "$logs/$r.log" 2>&1 &
    pids+=($!)
  done
  sleep 1.5
  ip -n "$b" link set "v${tag}b" down
  rc=0
  if wait "${pids[0]}"; then rc=1; echo "rank 0 did not notice that rank 1's host was cut off"; fi
  grep -h "failed" "$logs/0.log" | tail -n 1 | cut -c1-300
  grep -q "rank 1" "$logs/0.log" || { echo "rank 0's error does not name rank 1"; rc=1; }
  took=$(( $(date +%s) - start ))
  echo "rank 0 done ${took} s after the start (cut at 1.5 s, LOOM_TIMEOUT_MS=4000)"
  (( took <= 9 )) || { echo "too slow"; rc=1; }
  wait "${pids[1]}" 2>/dev/null
  pids=()
  exit $rc
elif [[ "$mode" == netns ]]; then
  n=4
  for r in 0 1 2 3; do
    if (( r < 2 )); then ns="$a"; host=hostA; else ns="$b"; host=hostB; fi
    ip netns exec "$ns" "${common[@]}" LOOM_COMM_ID="198.51.100.1:$port" LOOM_NRANKS=4 \
      LOOM_RANK=$r LOOM_HOST_ID=$host "$check" > "$logs/$r.log" 2>&1 &
    pids+=($!)
  done
elif [[ "$mode" == mismatch ]]; then
  start=$(date +%s)
  for r in 0 1; do
    only=""
    (( r == 1 )) && only="LOOM_TRANSPORTS=self,shm,tcp"
    "${common[@]}" $only LOOM_COMM_ID="127.0.0.1:$port" LOOM_NRANKS=2 LOOM_RANK=$r \
      LOOM_HOST_ID="host$r" "$check" > "$logs/$r.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for r in 0 1; do
    if wait "${pids[$r]}"; then rc=1; echo "rank $r passed with different transports"; fi
    grep -q "does not have in that place" "$logs/$r.log" ||
      { echo "rank $r's error does not say the transports differ:"; tail -n 2 "$logs/$r.log"; rc=1; }
  done
  grep -h "does not have" "$logs/0.log" | tail -n 1 | cut -c1-400
  took=$(( $(date +%s) - start ))
  (( took <= 10 )) || { echo "too slow: ${took} s"; rc=1; }
  pids=()
  exit $rc
elif [[ "$mode" == kill ]]; then
  loom_hosts_kill "$check" "$logs" "$port" "${common[@]:1}" LOOM_IB_TIMEOUT=14 LOOM_IB_RETRY_CNT=3
  exit $?
else
  loom_hosts_start "$check" "$logs" "$port" "$n" "${common[@]:1}"
fi
rc=0
loom_hosts_wait "$logs" "$n" || rc=1
grep -h "connected to rank" "$logs"/*.log | sed 's/.*loom INFO //' | sort | uniq -c
grep -q "connected to rank .* via net/ib" "$logs"/*.log || { echo "no net/ib connection seen"; rc=1; }
if [[ "$mode" == netns ]]; then
  grep -q "connected to rank .* via shm" "$logs"/*.log || { echo "no shm connection seen"; rc=1; }
  grep -h "net/ib: loomemu0" "$logs"/*.log | sed 's/.*loom INFO //' | sort -u
fi
exit $rc
