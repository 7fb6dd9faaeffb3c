#!/usr/bin/env bash
# The hierarchical all-reduce of host buffers without root: HOSTS x LOCAL processes over
# loopback, each claiming the host LOOM_HOST_ID=host<r / LOCAL>, with LOOM_ALGO=hier (and
# as the tuner chooses, and with shared memory off so that every link is TCP and receives
# land straight in the caller's buffer). loom_rank_check checks every result (and that the
# average is bitwise the same on every rank); the logs must show the hierarchical all-reduce,
# all-gather and reduce-scatter.
# Mode topo: as the tuner chooses, with the first host's topology read from a file whose
# NIC is faster than the others' (tests/fixtures/topology/host_25gbe.xml): every rank must
# still choose the same form for every call (each prices the slowest host's links).
# Mode tree: LOOM_ALGO=tree, which on hosts of several ranks is the host tree (a double
# binary tree across the hosts, a chain inside each); the logs must show tree all-reduces.
# Usage: hier_hosts_test.sh PATH/TO/loom_rank_check HOSTS LOCAL [hier|auto|tcp|topo|tree]
set -uo pipefail
check=$1 hosts=$2 local=$3 mode=${4:-hier}
n=$((hosts * local))
source "$(dirname "$0")/../../scripts/lib/ports.sh"
port=$(loom_free_port)
tag="loomhier$$"
extra=(LOOM_ALGO=hier)
[[ $mode == auto || $mode == topo ]] && extra=()
fixture="$(cd "$(dirname "$0")/../fixtures/topology" && pwd)/host_25gbe.xml"
[[ $mode == tcp ]] && extra=(LOOM_ALGO=hier LOOM_SHM_DISABLE=1)
[[ $mode == tree ]] && extra=(LOOM_ALGO=tree)
pids=()
for ((r = 0; r < n; ++r)); do
  topo=()
  [[ $mode == topo ]] && ((r / local == 0)) && topo=(LOOM_TOPO_FILE="$fixture")
  env "${topo[@]}" LOOM_COMM_ID="127.0.0.1:$port" LOOM_NRANKS=$n LOOM_RANK=$r LOOM_HOST_ID="host$((r / local))" \
    LOOM_TIMEOUT_MS=60000 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=COLL "${extra[@]}" \
    "$check" > "/tmp/$tag.$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((r = 0; r < n; ++r)); do
  if ! wait "${pids[$r]}"; then
    rc=1
    echo "rank $r failed:"
    grep -v "INFO" "/tmp/$tag.$r.log" | tail -n 5
  fi
done
echo "all-reduce forms ($hosts hosts x $local ranks, $mode):"
grep -ho "AllReduce([a-z]*, [0-9]* x [a-z0-9]*)" /tmp/$tag.*.log | sort | uniq -c
grep -ho "AllGather([a-z]*, [0-9]* x [a-z0-9]*)" /tmp/$tag.*.log | sort | uniq -c
grep -ho "ReduceScatter([a-z]*, [0-9]* x [a-z0-9]*)" /tmp/$tag.*.log | sort | uniq -c
hier=$(grep -h "AllReduce(hier" /tmp/$tag.*.log | wc -l)
gather=$(grep -h "AllGather(hier" /tmp/$tag.*.log | wc -l)
scatter=$(grep -h "ReduceScatter(hier" /tmp/$tag.*.log | wc -l)
if [[ $mode == tree ]]; then
  if ! grep -q "AllReduce(tree" /tmp/$tag.*.log; then echo "no tree all-reduce seen"; rc=1; fi
elif [[ $mode != auto && $mode != topo ]] && ((hier == 0 || gather == 0 || scatter == 0)); then
  echo "no hierarchical all-reduce, all-gather or reduce-scatter seen"
  rc=1
fi
# Every call's form the same on every rank: one form per collective, count and type.
split=$(grep -ho "\(All[A-Za-z]*\|ReduceScatter\|Reduce\|Broadcast\)([a-z]*, [0-9]* x [a-z0-9]*)" \
          /tmp/$tag.*.log | sort -u | awk '{ split($1, a, "("); print a[1], $2, $4 }' | sort | uniq -d)
if [[ -n $split ]]; then echo "ranks chose different forms for counts: $split"; rc=1; fi
rm -f /tmp/$tag.*.log
exit $rc
