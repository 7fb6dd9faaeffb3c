#!/usr/bin/env bash
# scripts/model_check.sh BUILD OUTDIR [RATE_MBIT [HOSTS...]]
#
# The cost model (collectives/cost_model.h) against measured host-memory all-reduces
# across "hosts" that are network namespaces on this machine: one rank in each, every
# namespace joined to one bridge by a veth pair whose both ends are shaped to RATE_MBIT
# (default 1000) with tc's token bucket (tbf), as a NIC of that speed would be. For each
# host count (default 2 4 8) and each algorithm (LOOM_ALGO ring, tree, direct, doubling,
# oneshot, and the tuner's own choice) bench/model_probe times 8 B to 4 MiB, and
# loom-model --csv predicts the same. Writes OUTDIR/model_check.md (predicted against
# measured, per algorithm and size; whether the tuner's pick was the measured fastest
# within 10 %) and the raw CSV.
#
# RANKS_PER_HOST=G (environment, default 1) puts G ranks in each namespace (they share
# memory, and the hierarchical form, LOOM_ALGO=hier, is measured too). COLL=all_gather or
# COLL=reduce_scatter checks that collective instead (ring and hier; sizes are the output's
# bytes for all-gather, the input's for reduce-scatter); COLL=reduce checks reduce to rank 0
# (tree and chain), COLL=broadcast broadcast from rank 0 (tree and chain).
#
# A veth is a virtual device (loom plans no wire for it) that reports 10 Gb/s whatever tc
# shapes it to, where a NIC reports its own speed: each namespace's ranks read their
# topology from a file (LOOM_TOPO_FILE, loom-topo's dump of the namespace) in which the veth
# is a NIC of RATE_MBIT, so that the tuner sees the link as the model's prediction does.
#
# Needs root, `ip netns`, a bridge and tc with tbf; says why and exits 77 otherwise.
# BUILD is a build tree with bench/model_probe and tools/loom-model.
set -uo pipefail
build=$(cd "${1:?usage: model_check.sh BUILD OUTDIR [RATE_MBIT [HOSTS...]]}" && pwd)
out=${2:?usage: model_check.sh BUILD OUTDIR [RATE_MBIT [HOSTS...]]}
rate=${3:-1000}
g=${RANKS_PER_HOST:-1}
coll=${COLL:-all_reduce}
shift $(($# < 3 ? $# : 3))
hosts=("$@")
((${#hosts[@]} > 0)) || hosts=(2 4 8)
probe=$build/bench/model_probe
model=$build/tools/loom-model
for b in "$probe" "$model"; do
  [[ -x $b ]] || { echo "model_check: $b is missing (build the tree with -DLOOM_BUILD_BENCHMARKS=ON)"; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$(dirname "$0")/lib/netns.sh"
tag="lm$$"
maxh=0
for h in "${hosts[@]}"; do ((h > maxh)) && maxh=$h; done
trap 'loom_netns_down "$tag" "$maxh"' EXIT
loom_netns_up "$tag" "$maxh" "$rate" || exit $?
gbps=$(awk -v r="$rate" 'BEGIN { printf "%.6g", r / 8000 }')
sizes=8,65536,1048576,4194304
measured=$out/measured_${rate}mbit.csv
predicted=$out/predicted_${rate}mbit.csv
echo "label,nranks,bytes,us_per_call,calls,wrong" > "$measured"
echo "coll,hosts,ranks_per_host,bytes,algo,us,busbw_gbps,built,picked,tuner" > "$predicted"
status=0
# Each namespace's topology with its link at the shaped rate.
for ((i = 0; i < maxh; ++i)); do
  ip netns exec "${tag}h$i" "$build/tools/loom-topo" --format xml 2>/dev/null |
    sed -E -e "/<net name=\"${tag}v$i\"/ { s/(speed=\")[0-9]+/\1$rate/; s/ virtual=\"1\"//; s/ kind=\"virtual\"//; }" \
    > "$out/topo_h$i.xml"
  grep -q "speed=\"$rate\"" "$out/topo_h$i.xml" || { echo "model_check: no link in namespace $i's topology"; exit 1; }
done
for h in "${hosts[@]}"; do
  "$model" --host-memory -N "$h" -g "$g" --net-gbps "$gbps" -c "$coll" -b 8 -e 4M -f 2 --csv | tail -n +2 >> "$predicted"
  n=$((h * g))
  algos=(ring tree direct doubling oneshot)
  [[ $coll == all_gather || $coll == reduce_scatter ]] && algos=(ring)
  [[ $coll == reduce || $coll == broadcast ]] && algos=(tree chain)
  ((g > 1)) && [[ $coll != reduce && $coll != broadcast ]] && algos+=(hier)
  for algo in "${algos[@]}" default; do
    ((n == 2)) && [[ $algo == tree && $coll == all_reduce ]] && continue  # no tree on 2 ranks
    ((n & (n - 1))) && [[ $algo == doubling ]] && continue      # powers of two only
    ((n > 4)) && [[ $algo == direct ]] && continue              # direct: up to 4 ranks
    port=$((20000 + RANDOM % 20000))
    pids=()
    for ((r = 0; r < n; ++r)); do
      env_algo=()
      [[ $algo != default ]] && env_algo=(LOOM_ALGO="$algo")
      ip netns exec "${tag}h$((r / g))" env LOOM_COMM_ID="198.51.100.10:$port" LOOM_RANK=$r LOOM_NRANKS=$n \
        LOOM_TOPO_FILE="$out/topo_h$((r / g)).xml" \
        LOOM_TIMEOUT_MS=60000 LOOM_HOST_ID="host$((r / g))" "${env_algo[@]}" \
        "$probe" --sizes "$sizes" --seconds 0.5 --label "$algo" --coll "$coll" \
        > "$out/probe_${rate}_${h}_${algo}_$r.log" 2>&1 &
      pids+=($!)
    done
    for ((r = 0; r < n; ++r)); do
      if ! wait "${pids[$r]}"; then
        status=1
        echo "model_check: $h hosts, $algo: rank $r failed:" >&2
        tail -n 5 "$out/probe_${rate}_${h}_${algo}_$r.log" >&2
      fi
    done
    grep -v "^model_probe\|WARN\|INFO" "$out/probe_${rate}_${h}_${algo}_0.log" >> "$measured"
    echo "model_check: $h hosts, $algo done"
  done
done
report=$out/model_check_${rate}mbit$( ((g > 1)) && echo "_${g}perhost")$([[ $coll != all_reduce ]] && echo "_$coll").md
python3 "$(dirname "$0")/model_table.py" "$measured" "$predicted" "$rate" > "$report" || status=1
echo "model_check: wrote $report"
exit $status
