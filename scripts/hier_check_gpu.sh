#!/usr/bin/env bash
# scripts/hier_check_gpu.sh PREFIX OUTDIR [SIZES]
#
# The hierarchical GPU forms across hosts (collectives/hierarchy.h) on one GPU
# machine: 2 processes as 2 hosts (LOOM_HOST_ID per process), each holding 2 ranks (the perf
# binaries' -g 2; LOOM_P2P_SHARE_GPU=1 lets a process's two ranks form a GPU mesh on the one
# GPU), every rank on GPU 0 (NCCL_TESTS_DEVICE=0), under CUDA MPS:
#   hier   all_reduce, broadcast, reduce, all_gather and reduce_scatter with LOOM_ALGO=hier
#          (the hierarchical form, forced)
#   flat   the same with LOOM_ALGO=^hier: every rank a network peer of every other, the
#          in-host pairs over loopback TCP too
#   auto   the same with no LOOM_ALGO: loom's own choice between the two (the cost model)
#   4x1    4 processes as 4 hosts of one rank, loom beside NVIDIA's NCCL (--compare nccl).
#          NCCL cannot run 2 x 2 here (it refuses two ranks of one communicator on one GPU),
#          so this is the nearest NCCL figure: the same 4 ranks, all over its Socket transport.
# -c 1 throughout. Writes OUTDIR/hier.md (table, machine, date, commands) and the logs.
# SIZES: the perf binaries' size flags (default "-b 8 -e 128M -f 8"); COLLS: the collectives
# (default all_reduce broadcast reduce all_gather reduce_scatter); RUN_LIMIT: seconds per run
# (default 120).
set -u
prefix=$(cd "$1" && pwd)
out=$2
sizes=${3:-"-b 8 -e 128M -f 8"}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
bin=$prefix/bin
source "$here/lib/gpu_hosts.sh"
loom_start_mps
# LOOM_TIMEOUT_MS: a call that waits on a peer for 20 s fails with what it waited for, where
# a run killed at its limit says nothing and leaves MPS refusing the next clients for a while
# (2026-12-05: the hier all_reduce stopped at 8 B; the flat run after it got CUDA error 46).
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0 -x LOOM_P2P_SHARE_GPU=1 -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=INIT,NET,COLL
     -x LOOM_TIMEOUT_MS=20000)
# Rows of a perf log as "size time busbw wrong-out wrong-in" (out-of-place time and busbw).
rows() { awk '/^ +[0-9]+ +[0-9]+ / { print $1, $6, $8, $9, $13 }' "$1"; }
{
  echo "# Hierarchical GPU forms: 2 hosts x 2 ranks on one GPU"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nvidia-smi -L | head -n1); $(nproc) cores; commit" \
       "${LOOM_COMMIT:-$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo '?')}"
  echo
  echo "Every rank on GPU 0 under CUDA MPS; each process a host of its own holding two ranks"
  echo "(-g 2, LOOM_P2P_SHARE_GPU=1); loopback TCP between the hosts. Float sum, out-of-place"
  echo "time (us) and busbw (GB/s), -c 1. The in-host mesh here is two ranks sharing one GPU,"
  echo "not NVLink: it shows the form works and what it saves on the network, not NVLink speed."
  echo
} > "$out/hier.md"
for c in ${COLLS:-all_reduce broadcast reduce all_gather reduce_scatter}; do
  echo "=== $c"
  loom_as_hosts "${RUN_LIMIT:-120}" 2 "$out/${c}_hier" env LOOM_ALGO=hier "$bin/${c}_perf" -g 2 $sizes -c 1 -n 20 -w 5 > "$out/${c}_hier.log" 2>&1
  echo "hier rc=$?"
  loom_as_hosts "${RUN_LIMIT:-120}" 2 "$out/${c}_flat" env LOOM_ALGO=^hier "$bin/${c}_perf" -g 2 $sizes -c 1 -n 20 -w 5 \
    > "$out/${c}_flat.log" 2>&1
  echo "flat rc=$?"
  loom_as_hosts "${RUN_LIMIT:-120}" 2 "$out/${c}_auto" "$bin/${c}_perf" -g 2 $sizes -c 1 -n 20 -w 5 \
    > "$out/${c}_auto.log" 2>&1
  echo "auto rc=$?"
  loom_as_hosts "${RUN_LIMIT:-120}" 4 "$out/${c}_4x1" "$bin/${c}_perf" $sizes -c 1 -n 20 -w 5 --compare nccl > "$out/${c}_4x1.log" 2>&1
  echo "4x1 rc=$?"
  {
    echo "## $c"
    echo
    echo "| size | hier us | hier busbw | flat us | flat busbw | hier / flat busbw | auto us | auto busbw | 4x1 loom us | 4x1 NCCL us | 4x1 NCCL busbw | wrong (hier; flat; auto; 4x1 loom, NCCL) |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    join <(rows "$out/${c}_hier.log") <(rows "$out/${c}_flat.log") |
      join - <(rows "$out/${c}_auto.log") |
      join - <(awk '/^ +[0-9]+ +[0-9]+ / { print $1, $6, $14, $15, $9 + $13, $16 + $20 }' "$out/${c}_4x1.log") |
      awk '{ r = ($7 > 0) ? sprintf("%.2f", $3 / $7) : "-";
             printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s; %s/%s; %s/%s; %s, %s |\n",
                    $1, $2, $3, $6, $7, r, $10, $11, $14, $15, $16, $4, $5, $8, $9, $12, $13, $17, $18 }'
    echo
  } >> "$out/hier.md"
done
cpu=$(grep -h "network proxy thread used" "$out"/*_hier.loom.*.log 2>/dev/null |
      sed -E 's/.*\(([0-9.]+) cores in all\).*/\1/' | sort -n | awk '{printf "%s%s", (NR>1?", ":""), $1}')
{
  echo "CPU of the proxy and socket helper threads per network executor in the hier runs,"
  echo "averaged over each run (cores, smallest to largest): ${cpu:-not logged}"
  echo
  echo "Commands: \`scripts/hier_check_gpu.sh PREFIX OUTDIR\`, which runs per collective C"
  echo "\`mpirun -np 2 ... bash -c 'LOOM_HOST_ID=host\$RANK LOOM_ALGO=hier C_perf -g 2 $sizes -c 1 -n 20 -w 5'\`"
  echo "with NCCL_TESTS_DEVICE=0 LOOM_P2P_SHARE_GPU=1 (flat: LOOM_ALGO=^hier), and the 4x1 run"
  echo "with -np 4 and --compare nccl."
} >> "$out/hier.md"
echo "wrote $out/hier.md"
