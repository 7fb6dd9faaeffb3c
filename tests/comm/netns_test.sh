#!/usr/bin/env bash
# Two "hosts" as network namespaces joined by a veth pair, two ranks in each: ranks of one
# namespace share memory, ranks in different ones go over TCP across the veth link. Run as
# the tuner chooses, then with the hierarchical all-reduce forced (LOOM_ALGO=hier).
# Needs root and `ip netns`; otherwise it says why and exits 77 (ctest: skipped).
# Usage: netns_test.sh PATH/TO/loom_rank_check
set -uo pipefail
check="$1"
if [[ $(id -u) -ne 0 ]]; then echo "SKIP: network namespaces need root"; exit 77; fi
if ! command -v ip >/dev/null; then echo "SKIP: no 'ip' command (iproute2)"; exit 77; fi
tag="loom$$"
a="${tag}a" b="${tag}b"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null; then
  echo "SKIP: 'ip netns add' refused here"; exit 77
fi
# TEST-NET-2 addresses, only ever inside these two namespaces.
ip link add "v${tag}a" netns "$a" type veth peer name "v${tag}b" netns "$b" || { echo "SKIP: veth refused"; exit 77; }
ip -n "$a" addr add 198.51.100.1/24 dev "v${tag}a"
ip -n "$b" addr add 198.51.100.2/24 dev "v${tag}b"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set "v${tag}a" up
ip -n "$b" link set "v${tag}b" up
rc=0
# Twice: as the tuner chooses, and with the hierarchical all-reduce forced (LOOM_ALGO=hier:
# rings inside each namespace over shm, one across them per local rank over tcp).
for algo in "" hier; do
  port=$((20000 + RANDOM % 20000))
  common=(env LOOM_COMM_ID="198.51.100.1:$port" LOOM_NRANKS=4 LOOM_TIMEOUT_MS=30000
          LOOM_NSOCKS_PERTHREAD=2 LOOM_ALGO="$algo")
  pids=()
  for r in 0 1 2 3; do
    if (( r < 2 )); then ns="$a"; host=hostA; else ns="$b"; host=hostB; fi
    ip netns exec "$ns" "${common[@]}" LOOM_RANK=$r LOOM_HOST_ID=$host LOOM_DEBUG=INFO \
      LOOM_DEBUG_SUBSYS=INIT,COLL "$check" > "/tmp/${tag}.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1 2 3; do
    if ! wait "${pids[$r]}"; then rc=1; echo "rank $r failed (LOOM_ALGO=$algo):"; fi
    grep -v " COLL \|INFO .*AllReduce\|INFO .*AllGather\|INFO .*SendRecv" "/tmp/${tag}.$r.log" | tail -n 3
  done
  # The cross-namespace pairs must have used tcp, the same-namespace ones shm.
  grep -h "connected to rank" /tmp/${tag}.*.log | sort | uniq -c
  grep -q "connected to rank .* via tcp" /tmp/${tag}.*.log || { echo "no tcp connection seen"; rc=1; }
  grep -q "connected to rank .* via shm" /tmp/${tag}.*.log || { echo "no shm connection seen"; rc=1; }
  echo "all-reduce forms (LOOM_ALGO=$algo):"
  grep -ho "AllReduce([a-z]*, [0-9]* x [a-z0-9]*): .*" /tmp/${tag}.*.log | sort | uniq -c
  if [[ $algo == hier ]]; then
    n=$(grep -h "AllReduce(hier" /tmp/${tag}.*.log | wc -l)
    echo "LOOM_ALGO=hier: $n hierarchical all-reduce(s) logged"
    ((n > 0)) || { echo "no hierarchical all-reduce seen"; rc=1; }
  fi
  rm -f /tmp/${tag}.*.log
done
exit $rc
