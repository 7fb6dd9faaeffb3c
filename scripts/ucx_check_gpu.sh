#!/usr/bin/env bash
# scripts/ucx_check_gpu.sh PREFIX OUTDIR [ROUNDS]
#
# The ucx network backend (transports/net/ucx) against the socket backend and NVIDIA's NCCL
# on one GPU machine: processes as hosts, all on GPU 0 (LOOM_HOST_ID / NCCL_HOSTID per
# process, NCCL_TESTS_DEVICE=0), under CUDA MPS where the machine has it, all_reduce_perf
# -b 16M -e 128M -f 8 -c 1 (GPU buffers, float sum), on 2 and 4 hosts. Each configuration
# runs once per round, the rounds one after another, so that a drift of the machine shows in
# every row. CONFIGS (default "socket ucx") picks them and their order (the ratios to the
# socket backend need socket first):
#   socket           LOOM_NET=socket (the baseline; this one also times NCCL: --compare nccl)
#   socket_netM      LOOM_NET=socket with LOOM_NET_LANES=M (M executor lanes; its ratio is
#                    to the plain socket row, as every other row's)
#   ucx              LOOM_NET=ucx with the machine's UCX and loom's defaults
#   ucxc_staged, ucxc_direct   where UCX_CUDA names a UCX built with CUDA
#                    (scripts/build_ucx_cuda.sh): that UCX, GPU buffers staged (UCX_TLS=tcp)
#                    and handed to UCX as they are (UCX_TLS=tcp,cuda_copy)
#   ucx_lane0        LOOM_UCX_LANE0_PART=1: lane 0 carries a part of each large message too
#   ucx_spin         LOOM_UCX_SPIN_US=200: lane threads progress 200 us before they sleep
#   ucx_put          UCX_RNDV_SCHEME=put_zcopy (tcp writes from and reads into the buffers)
#   ucx_prepost      LOOM_UCX_PREPOST=1: lane 1's receive posted with the message
#   ucx_lanesN       LOOM_UCX_LANES=N (N a whole number); ucx_lanesN_netM also
#                    LOOM_NET_LANES=M (fewer executor lanes, more UCX lanes each)
# Writes OUTDIR/ucx_check_gpu.md (16 and 128 MiB busbw of each run, and the ratio of ucx's
# to the socket backend's of the same round and host count) and the logs.
#
# PREFIX is an install tree built with MPI (cmake --install build --prefix PREFIX).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). RUN_LIMIT: seconds per run (default 90).
set -u
prefix=$(cd "$1" && pwd)
out=$2
rounds=${3:-2}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/gpu_hosts.sh"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
bin=$prefix/bin
limit=${RUN_LIMIT:-90}
# shellcheck disable=SC2034  # read by loom_as_hosts
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0 -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=NET -x LOOM_TIMEOUT_MS=20000)
sizes=(-b 16M -e 128M -f 8 -c 1 -n 20 -w 5)
loom_start_mps
report=$out/ucx_check_gpu.md
{
  echo "# ucx against sockets, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nproc) cores;" \
    "system UCX: $(ucx_info -v 2>/dev/null | sed -n 's/.*version=\([^ ]*\).*/\1/p' | head -1)"
  [ -n "${UCX_CUDA:-}" ] && echo "UCX_CUDA: $("$UCX_CUDA/bin/ucx_info" -v | head -1)" &&
    echo "its CUDA transports here: $(LD_LIBRARY_PATH=$UCX_CUDA/lib:/usr/local/cuda/lib64 \
      "$UCX_CUDA/bin/ucx_info" -d | sed -n 's/.*Transport: \(cuda.*\)/\1/p' | sort -u | tr '\n' ' ')"
  echo
  echo "| hosts | round | configuration | 16 MiB | 128 MiB | / socket (16, 128) | NCCL (16, 128) | wrong |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} > "$report"

# Rows: size count type redop root time algbw busbw #wrong (in-place) time algbw busbw #wrong,
# and with --compare nccl: NCCL's time busbw #wrong ratio (out of place) and the in-place ones.
row() {  # LOG -> "bw16 bw128 nccl16 nccl128 wrong" (out of place; "-" where missing)
  awk '/^ +[0-9]+ +[0-9]+ +float/ {
         if ($1 == 16777216) { a = $8; c = $15 } if ($1 == 134217728) { b = $8; d = $15 }
         w += $9 + $13 }
       END { printf "%s %s %s %s %s\n", a ? a : "-", b ? b : "-", c ? c : "-", d ? d : "-", w + 0 }' "$1"
}
declare -A base16 base128
one() {  # HOSTS ROUND NAME ENV... (then the binary's arguments follow the env)
  local np=$1 round=$2 name=$3
  shift 3
  local log=$out/${name}_h${np}_r${round}
  SECONDS=0
  loom_as_hosts "$limit" "$np" "$log" env "$@" > "$log.log" 2>&1
  local rc=$?
  local b16 b128 n16 n128 wrong
  read -r b16 b128 n16 n128 wrong < <(row "$log.log")
  local ratio="" cmp="" key="$np.$round"
  if [[ $name == socket ]]; then
    base16[$key]=$b16 base128[$key]=$b128
    cmp="$n16, $n128"
  elif [[ -n "${base16[$key]:-}" && $b16 != - && $b128 != - ]]; then
    ratio=$(awk -v a="$b16" -v b="$b128" -v c="${base16[$key]}" -v d="${base128[$key]}" \
      'BEGIN { printf "%.2f, %.2f", a / c, b / d }')
  fi
  [[ $rc -ne 0 ]] && wrong="$wrong (rc $rc, ${SECONDS}s)"
  echo "| $np | $round | $name | $b16 | $b128 | $ratio | $cmp | $wrong |" | tee -a "$report"
  grep -ho "net/ucx: UCX [^;]*\|GPU buffers go through page-locked host memory\|the FIFOs' slots in GPU memory" \
    "$log".loom.*.log 2>/dev/null | sort -u | head -3
}
ar=("$bin/all_reduce_perf" "${sizes[@]}")
# config NAME: the variables (and, for socket, the extra argument) of configuration NAME
# in the array cfg; 1 with a message where there is none.
config() {
  local lib="LD_LIBRARY_PATH=${UCX_CUDA:-}/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
  case $1 in
    socket) cfg=(LOOM_NET=socket "${ar[@]}" --compare nccl) ;;
    socket_net*)
      [[ ${1#socket_net} =~ ^[0-9]+$ ]] || { echo "ucx_check_gpu: $1: socket_netM (a whole number)"; return 1; }
      cfg=(LOOM_NET=socket LOOM_NET_LANES="${1#socket_net}" "${ar[@]}") ;;
    ucx) cfg=(LOOM_NET=ucx "${ar[@]}") ;;
    ucxc_staged | ucxc_direct)
      [ -n "${UCX_CUDA:-}" ] || { echo "ucx_check_gpu: $1 needs UCX_CUDA (a UCX built with CUDA)"; return 1; }
      local tls=tcp
      [ "$1" = ucxc_direct ] && tls=tcp,cuda_copy
      cfg=("$lib" LOOM_NET=ucx "UCX_TLS=$tls" "${ar[@]}") ;;
    ucx_lane0) cfg=(LOOM_NET=ucx LOOM_UCX_LANE0_PART=1 "${ar[@]}") ;;
    ucx_spin) cfg=(LOOM_NET=ucx LOOM_UCX_SPIN_US=200 "${ar[@]}") ;;
    ucx_put) cfg=(LOOM_NET=ucx UCX_RNDV_SCHEME=put_zcopy "${ar[@]}") ;;
    ucx_prepost) cfg=(LOOM_NET=ucx LOOM_UCX_PREPOST=1 "${ar[@]}") ;;
    ucx_lanes*)
      [[ ${1#ucx_lanes} =~ ^([0-9]+)(_net([0-9]+))?$ ]] ||
        { echo "ucx_check_gpu: $1: ucx_lanesN or ucx_lanesN_netM (whole numbers)"; return 1; }
      cfg=(LOOM_NET=ucx LOOM_UCX_LANES="${BASH_REMATCH[1]}")
      [ -n "${BASH_REMATCH[3]}" ] && cfg+=(LOOM_NET_LANES="${BASH_REMATCH[3]}")
      cfg+=("${ar[@]}") ;;
    *) echo "ucx_check_gpu: no configuration $1 (see the head of this script)"; return 1 ;;
  esac
}
configs() {  # HOSTS ROUND
  local np=$1 r=$2 c
  for c in ${CONFIGS:-socket ucx}; do
    config "$c" && one "$np" "$r" "$c" "${cfg[@]}"
  done
}
# Every name is checked before the first run.
for c in ${CONFIGS:-socket ucx}; do config "$c" || exit 2; done
for r in $(seq 1 "$rounds"); do configs 2 "$r"; configs 4 "$r"; done
{
  echo
  echo "busbw in GB/s, out of place; wrong: loom's -c 1 counts, out of place and in place added."
  echo "Command: CONFIGS=\"${CONFIGS:-socket ucx}\" scripts/ucx_check_gpu.sh PREFIX OUTDIR $rounds${UCX_CUDA:+ (UCX_CUDA=$UCX_CUDA)}"
} >> "$report"
