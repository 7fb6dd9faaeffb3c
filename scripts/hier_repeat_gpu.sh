#!/usr/bin/env bash
# scripts/hier_repeat_gpu.sh PREFIX OUTDIR [REPEATS]
#
# Repeats the hierarchical GPU forms' perf runs that have hung or that need a same-call
# comparison, on one GPU machine: 2 processes as 2 hosts of 2 ranks each, every rank on
# GPU 0 (LOOM_P2P_SHARE_GPU=1, NCCL_TESTS_DEVICE=0), CUDA MPS restarted around each run
# (a client killed at its deadline leaves MPS refusing the next ones for a while):
#   ag_t2, ar_t2      all_gather / all_reduce, LOOM_ALGO=hier, a thread per rank (-t 2 -g 1)
#   ag_g2_q8_i        all_gather, LOOM_ALGO=hier, one thread for both ranks (-g 2), CUDA's
#                     default 8 hardware queues per process
#   ag_g2_q1_i        the same with CUDA_DEVICE_MAX_CONNECTIONS=1: one in-order queue for
#                     both ranks' streams, where the all-gather's last copy (queued behind
#                     its rank's spinning mesh kernel) could hold back the peer's rail and
#                     mesh kernels; LOOM_P2P_SHARE_GPU_GATE (on by default) orders the
#                     ranks' enqueues so that it cannot (collectives/device/phase_gate.h)
#   ag_g2_q1_nogate_i the same with the gate off: should the hang come from the queues the
#                     ranks share, this run hangs most often
#   ar_g2_q1_i, ar_g2_q1_nogate_i   all_reduce likewise (its rail kernel follows a
#                     spinning mesh kernel)
#   bc_split_i        broadcast of 16 MiB with no LOOM_ALGO (an even count: split over the rails)
#   bc_whole_i        the same less 4 bytes (an odd count: whole on the root's rail)
# REPEATS (default 3) of each numbered run. LOOM_TIMEOUT_MS=6000: a hung call fails with what
# it waited for. Prints one line per run (exit status, seconds, rows, the last rows'
# out-of-place time and busbw and in-place wrong count, the first failure); logs in OUTDIR.
set -u
prefix=$(cd "$1" && pwd)
out=$2
repeats=${3:-3}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
bin=$prefix/bin
source "$here/lib/gpu_hosts.sh"
mps=/usr/local/nvidia/bin/nvidia-cuda-mps-control
[ -x "$mps" ] || mps=$(command -v nvidia-cuda-mps-control || echo true)
# shellcheck disable=SC2034  # read by loom_as_hosts
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0 -x LOOM_P2P_SHARE_GPU=1 -x LOOM_DEBUG=WARN -x LOOM_TIMEOUT_MS=6000)
one() {  # NAME CMD...
  local name=$1
  shift
  "$mps" -d
  SECONDS=0
  loom_as_hosts 30 2 "$out/$name" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${SECONDS}s $(grep -c '^ \+[0-9]' "$out/$name.log") rows"
  grep -E '^ +[0-9]+ ' "$out/$name.log" | awk '{print "   ", $1, $6, $8, $9, $13}' | tail -3
  grep -h "Test failure" "$out/$name.log" | head -1 | cut -c1-200
  grep -h WARN "$out/$name".loom.*.log 2>/dev/null | grep -v "one GPU" | head -1 | cut -c1-300
  echo quit | "$mps" 2>/dev/null
  sleep 1
}
sizes=(-b 2M -e 16M -f 8 -c 1 -n 5 -w 2)
one ag_t2 env LOOM_ALGO=hier "$bin/all_gather_perf" -t 2 -g 1 "${sizes[@]}"
one ar_t2 env LOOM_ALGO=hier "$bin/all_reduce_perf" -t 2 -g 1 "${sizes[@]}"
for i in $(seq 1 "$repeats"); do
  one "ag_g2_q8_$i" env LOOM_ALGO=hier "$bin/all_gather_perf" -g 2 "${sizes[@]}"
  for coll in ag ar; do
    b=$bin/all_gather_perf
    [[ $coll == ar ]] && b=$bin/all_reduce_perf
    one "${coll}_g2_q1_$i" env LOOM_ALGO=hier CUDA_DEVICE_MAX_CONNECTIONS=1 "$b" -g 2 "${sizes[@]}"
    one "${coll}_g2_q1_nogate_$i" env LOOM_ALGO=hier CUDA_DEVICE_MAX_CONNECTIONS=1 \
      LOOM_P2P_SHARE_GPU_GATE=0 "$b" -g 2 "${sizes[@]}"
  done
done
for i in $(seq 1 "$repeats"); do
  one "bc_split_$i" "$bin/broadcast_perf" -g 2 -b 16777216 -e 16777216 -c 1 -n 10 -w 3
  one "bc_whole_$i" "$bin/broadcast_perf" -g 2 -b 16777212 -e 16777212 -c 1 -n 10 -w 3
done
