# shellcheck shell=bash
# For scripts that run processes as hosts on one GPU machine (source it):
#
#   loom_start_mps                 starts CUDA MPS where the machine has it and stops it
#                                  when the script exits (sets an EXIT trap); says so
#                                  where it has not: the processes then time-slice the GPU
#   loom_as_hosts LIMIT NP STEM CMD...
#                                  runs CMD as NP processes under "${mpi[@]}" (the caller's
#                                  mpirun command line), each claiming a host of its own
#                                  (LOOM_HOST_ID / NCCL_HOSTID host<rank>) with its loom log
#                                  in STEM.loom.<pid>.log, for at most LIMIT seconds. Where
#                                  neither the caller's mpirun line nor the environment sets
#                                  LOOM_TIMEOUT_MS, it is LIMIT - 10 s (half of LIMIT up to
#                                  20 s), so a stalled call fails and its loom log says where
#                                  every rank was, before the limit stops the processes
#   loom_ring_probe BIN OUT HERE   the path of tcp_ring_probe: BIN/tcp_ring_probe where it
#                                  was built beforehand, else compiled into OUT from
#                                  HERE/bench/tcp_ring_probe.cc (HERE: the scripts folder)

loom_start_mps() {
  local mps=/usr/local/nvidia/bin/nvidia-cuda-mps-control
  [ -x "$mps" ] || mps=$(command -v nvidia-cuda-mps-control || true)
  if [ -n "$mps" ]; then
    "$mps" -d && echo "MPS started"
    # shellcheck disable=SC2064
    trap "echo quit | '$mps'" EXIT
  else
    echo "no nvidia-cuda-mps-control: the processes will time-slice the GPU (times mean little)"
  fi
}

loom_ring_probe() {
  local bin=$1 out=$2 here=$3
  if [ -x "$bin/tcp_ring_probe" ]; then
    echo "$bin/tcp_ring_probe"  # built beforehand (machines without a compiler)
  else
    c++ -O2 -std=c++17 "$here/bench/tcp_ring_probe.cc" -o "$out/tcp_ring_probe" || return 1
    echo "$out/tcp_ring_probe"
  fi
}

loom_as_hosts() {
  local limit=$1 np=$2 stem=$3
  shift 3
  local extra=()
  if [[ " ${mpi[*]} " != *LOOM_TIMEOUT_MS* && -z "${LOOM_TIMEOUT_MS:-}" ]]; then
    extra=(-x "LOOM_TIMEOUT_MS=$((limit > 20 ? (limit - 10) * 1000 : limit * 500))")
  fi
  timeout "$limit" "${mpi[@]}" -np "$np" "${extra[@]}" -x LOOM_DEBUG_FILE="$stem.loom.%p.log" bash -c \
    'export LOOM_HOST_ID=host$OMPI_COMM_WORLD_RANK NCCL_HOSTID=host$OMPI_COMM_WORLD_RANK; exec "$@"' x "$@"
  local rc=$?
  if ((rc == 124)); then
    echo "loom_as_hosts: stopped at the ${limit} s limit ($np processes; loom's logs: $stem.loom.*.log)" >&2
  fi
  return $rc
}
