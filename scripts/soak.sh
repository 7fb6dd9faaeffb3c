#!/usr/bin/env bash
# scripts/soak.sh SOAK_CHECK [MODE] [RANKS] [SECONDS] [SEED] [CHECK_ARGS...]
#
# A randomized soak of collectives: RANKS processes of tests/comm/soak_check
# (build/tests/comm/loom_soak_check) on this machine draw the same calls from SEED (every
# collective, six data types, every reduction, counts from 0 to 2 Mi elements, in place and
# out, groups) for SECONDS and check every element. MODE says how the ranks reach each other:
#   shm     one host: shared memory
#   tcp     one host, LOOM_SHM_DISABLE=1: the tcp transport
#   hosts   each rank a host of its own (LOOM_HOST_ID): the socket network backend
#   ucx     each rank a host of its own over the ucx backend (LOOM_NET=ucx, UCX_TLS=tcp)
#   hier    hosts of two ranks each: shared memory inside, the network across, and the
#           hierarchical forms where the tuner takes them
# CHECK_ARGS go to every rank: `--memory device` puts the buffers on GPU 0 (every rank
# there: start CUDA MPS first, or the processes take turns on the GPU), `--max-count C`
# bounds the counts. Defaults: hosts, 4 ranks, 300 s, seed 1. LOOM_TIMEOUT_MS is 30000,
# so a call that waits on a peer that long fails with what it waited for. Exits 1 if any rank failed or did
# not end within SECONDS + 120 s, with each rank's last lines; rank 0's summary otherwise.
set -u
check=$(realpath "${1:?usage: soak.sh SOAK_CHECK [shm|tcp|hosts|ucx|hier] [RANKS] [SECONDS] [SEED]}")
mode=${2:-hosts}
n=${3:-4}
seconds=${4:-300}
seed=${5:-1}
shift $(( $# < 5 ? $# : 5 ))
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/ports.sh"
logs=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; [[ -n ${LOOM_KEEP_LOGS:-} ]] || rm -rf "$logs"' EXIT
port=$(loom_free_port)
vars=(LOOM_COMM_ID="127.0.0.1:$port" LOOM_COMM_SECRET="soak$$" LOOM_NRANKS="$n" LOOM_TIMEOUT_MS=30000)
case $mode in
  shm | hosts | hier) ;;
  tcp) vars+=(LOOM_SHM_DISABLE=1) ;;
  ucx) vars+=(LOOM_NET=ucx UCX_TLS=tcp) ;;
  *) echo "soak: unknown mode '$mode' (shm, tcp, hosts, ucx, hier)"; exit 2 ;;
esac
echo "soak: $n ranks, $mode, ${seconds} s, seed $seed${*:+, $*} (logs: $logs)"
for ((r = 0; r < n; r++)); do
  host=()
  case $mode in
    hosts | ucx) host=(LOOM_HOST_ID="host$r") ;;
    hier) host=(LOOM_HOST_ID="host$((r / 2))") ;;
  esac
  timeout -s KILL $((seconds + 120)) env "${vars[@]}" "${host[@]}" LOOM_RANK=$r \
    "$check" --seconds "$seconds" --seed "$seed" "$@" > "$logs/$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if ((rc != 0)); then
    status=1
    echo "rank $r failed (exit $rc$( ((rc == 137)) && echo ': killed at the time limit')):"
    tail -n 5 "$logs/$r.log"
  fi
done
pids=()
if ((status == 0)); then cat "$logs/0.log"; fi
exit $status
