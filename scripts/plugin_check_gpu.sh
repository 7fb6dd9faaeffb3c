#!/usr/bin/env bash
# scripts/plugin_check_gpu.sh PREFIX OUTDIR [HOSTS...]
#
# NCCL's network plugin ABI, checked from both sides on one GPU machine: HOSTS processes
# (default 2, then 4) on GPU 0, each claiming a host of its own (LOOM_HOST_ID, NCCL_HOSTID,
# NCCL_TESTS_DEVICE=0), under CUDA MPS where the machine has it, run all_reduce_perf
# -b 8 -e 128M -f 8 -c 1 --compare nccl with NCCL_NET_PLUGIN naming loom's exported plugin
# (PREFIX/lib/libnccl-net-loom.so, and libnccl-net-loomv8.so where it is there): NVIDIA's
# NCCL and loom both load it and move every byte between the hosts through it. The logs
# must show it: NCCL's "Loaded net plugin Loom" and "Using network Loom", loom's
# "NCCL network plugin Loom". The same sweep without a plugin (loom's sockets, NCCL's
# Socket) is the baseline. Writes OUTDIR/plugin_check_gpu.md and keeps the logs of the
# last run only.
set -u
prefix=$(cd "${1:?usage: plugin_check_gpu.sh PREFIX OUTDIR [HOSTS...]}" && pwd)
out=${2:?usage: plugin_check_gpu.sh PREFIX OUTDIR [HOSTS...]}
shift 2
hosts=("$@")
((${#hosts[@]} > 0)) || hosts=(2 4)
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
source "$here/lib/gpu_hosts.sh"
md=$out/plugin_check_gpu.md
loom_start_mps > "$out/mps.txt"  # here, not in a subshell: its EXIT trap stops MPS
{
  echo "# NCCL network plugin check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "$(nvidia-smi -L 2>/dev/null | head -n1); $(nproc) cores; $(cat "$out/mps.txt")"
} > "$md"
rm -f "$out/mps.txt"
rc=0
sweep() {  # label hosts plugin(or none)
  local label=$1 np=$2 plugin=$3 log=$out/run.log
  rm -f "$out"/*.nccl.log "$out"/*.loom.log
  timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
    -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_TESTS_DEVICE=0 -x NCCL_NET_PLUGIN="$plugin" \
    -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET -x NCCL_DEBUG_FILE="$out/%p.nccl.log" \
    -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=INIT,NET -x LOOM_DEBUG_FILE="$out/%p.loom.log" \
    bash -c 'export LOOM_HOST_ID=host$OMPI_COMM_WORLD_RANK NCCL_HOSTID=host$OMPI_COMM_WORLD_RANK; exec "$@"' x \
    "$prefix/bin/all_reduce_perf" -b 8 -e 128M -f 8 -c 1 -n 20 -w 5 --compare nccl > "$log" 2>&1
  local status=$?
  {
    echo
    echo "## $label: $np hosts, NCCL_NET_PLUGIN=$plugin (exit $status)"
    echo
    if [[ $plugin != none ]]; then
      echo "- NCCL: $(grep -aho 'Loaded net plugin [^ ]* ([^)]*)' "$out"/*.nccl.log | sort -u | tr '\n' ' ')$(grep -aho 'Using network [A-Za-z]*' "$out"/*.nccl.log | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
      echo "- loom: $(grep -aho 'NCCL network plugin Loom ([^)]*)' "$out"/*.loom.log | sort -u | sed 's|from .*/|from |' | tr '\n' ' ')"
    else
      echo "- NCCL: $(grep -aho 'Using network [A-Za-z]*' "$out"/*.nccl.log | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
    fi
    echo "- wrong results (loom, NCCL): $(awk '/^ +[0-9]+ +[0-9]+ / {l += $9 + $13; n += $16 + $20} END {print l + 0, n + 0}' "$log")"
    echo
    echo "Out-of-place, as all_reduce_perf prints it:"
    echo
    echo "| bytes | loom us | loom busbw GB/s | NCCL us | NCCL busbw GB/s |"
    echo "| ---: | ---: | ---: | ---: | ---: |"
    awk '/^ +[0-9]+ +[0-9]+ / {printf "| %s | %s | %s | %s | %s |\n", $1, $6, $8, $14, $15}' "$log"
  } >> "$md"
  [[ $status == 0 ]] || rc=1
  if [[ $plugin != none ]]; then
    grep -aq "Using network Loom" "$out"/*.nccl.log || { echo "- **NCCL did not use the plugin**" >> "$md"; rc=1; }
    grep -aq "NCCL network plugin Loom" "$out"/*.loom.log || { echo "- **loom did not use the plugin**" >> "$md"; rc=1; }
  fi
}
for np in "${hosts[@]}"; do
  sweep "plugin v11" "$np" "$prefix/lib/libnccl-net-loom.so"
  [[ -f $prefix/lib/libnccl-net-loomv8.so ]] && sweep "plugin v8" "$np" "$prefix/lib/libnccl-net-loomv8.so"
  sweep "no plugin (loom sockets, NCCL Socket)" "$np" none
done
cat "$md"
exit $rc
