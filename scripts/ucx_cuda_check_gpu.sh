#!/usr/bin/env bash
# scripts/ucx_cuda_check_gpu.sh PREFIX UCX_CUDA OUTDIR
#
# Two processes as hosts on one GPU machine over a UCX built with CUDA
# (scripts/build_ucx_cuda.sh) with its CUDA transports in UCX_TLS (docs/perf/ucx.md: they
# could not connect until loom set UCX_RNDV_FRAG_MEM_TYPES=host), and what GPU buffers do.
# all_reduce_perf -b 16M -e 16M -c 1 over LOOM_NET=ucx, 2 processes, each configuration once:
#   tls_tcp            UCX_TLS=tcp (connected on 2026-12-06; the reference)
#   tls_cuda           UCX_TLS=tcp,cuda_copy
#   tls_cuda_lo        the same with UCX_NET_DEVICES=lo
#   tls_cuda_eth       the same with UCX_NET_DEVICES=<the first interface with an IPv4 address
#                      but lo>
#   tls_cuda_direct    the same as tls_cuda_lo with LOOM_SOCKET_IFNAME=lo: an interface with
#                      no place on the PCI tree, where loom hands GPU buffers to UCX instead of
#                      staging them (transports/net/gdr.cc placeSlots)
#   tls_cuda_probe     tls_cuda with UCX_RNDV_FRAG_MEM_TYPES=host,cuda, UCX's default, which
#                      loom otherwise sets to host (transports/net/ucx/ucx_backend.cc open():
#                      the probe for cuda fragments frees GPU memory, which waits for the
#                      running network kernels)
# first without CUDA MPS, then with it. Writes OUTDIR/ucx_cuda.md (busbw, wrong values, the
# UCX errors and loom's placement line of each run), `ucx_info -d` and the logs (UCX_LOG_LEVEL
# =debug for the runs that fail to connect).
set -u
prefix=$(cd "${1:?usage: ucx_cuda_check_gpu.sh PREFIX UCX_CUDA OUTDIR}" && pwd)
ucx=$(cd "${2:?usage: ucx_cuda_check_gpu.sh PREFIX UCX_CUDA OUTDIR}" && pwd)
out=${3:?usage: ucx_cuda_check_gpu.sh PREFIX UCX_CUDA OUTDIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/gpu_hosts.sh"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$ucx/lib:/usr/local/cuda/lib64:$prefix/lib:${LD_LIBRARY_PATH:-}"
eth=  # the first network interface but lo (the machine may have no `ip`)
for d in /sys/class/net/*/; do
  d=$(basename "$d")
  [ "$d" != lo ] && { eth=$d; break; }
done
# shellcheck disable=SC2034  # read by loom_as_hosts
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0 -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=NET -x LOOM_TIMEOUT_MS=15000)
"$ucx/bin/ucx_info" -v > "$out/ucx_info.txt" 2>&1
"$ucx/bin/ucx_info" -d >> "$out/ucx_info.txt" 2>&1
report=$out/ucx_cuda.md
{
  echo "# UCX built with CUDA between processes as hosts, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "$(nvidia-smi -L | head -1); $(head -1 "$out/ucx_info.txt"); first interface $eth"
  echo
  echo "| MPS | configuration | rc | 16 MiB busbw | wrong | UCX errors | loom's placement |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
} > "$report"
one() {  # MPS NAME ENV...
  local mps=$1 name=$2
  shift 2
  local stem=$out/${name}_mps$mps
  loom_as_hosts 45 2 "$stem" env "$@" "$prefix/bin/all_reduce_perf" -b 16M -e 16M -c 1 -n 10 -w 3 \
    > "$stem.log" 2>&1
  local rc=$?
  local bw wrong errs place
  bw=$(awk '/^ +[0-9]+ +[0-9]+ / { print $8 }' "$stem.log" | head -1)
  wrong=$(awk '/^ +[0-9]+ +[0-9]+ / { print $9 + $13 }' "$stem.log" | head -1)
  errs=$(grep -ho "UCX  *ERROR.*\|Destination is unreachable" "$stem.log" "$stem".loom.*.log 2>/dev/null |
    sed 's/fd=[0-9]*/fd=N/; s/:[0-9]\{4,5\}/:PORT/' | sort -u | head -2 | tr '\n' ';' | tr '|' '/')
  place=$(grep -ho "GPU buffers go through page-locked host memory\|the FIFOs' slots in GPU memory" \
    "$stem".loom.*.log 2>/dev/null | sort -u | head -1)
  echo "| $mps | $name | $rc | ${bw:--} | ${wrong:--} | ${errs:--} | ${place:--} |" | tee -a "$report"
  if [ "$rc" -ne 0 ] && [ -z "$bw" ]; then  # again with UCX's own account of the wire-up
    loom_as_hosts 45 2 "$stem.debug" env UCX_LOG_LEVEL=debug "$@" "$prefix/bin/all_reduce_perf" \
      -b 16M -e 16M -c 1 -n 2 -w 1 > "$stem.debug.log" 2>&1
  fi
}
configs() {
  one "$1" tls_tcp LOOM_NET=ucx UCX_TLS=tcp
  one "$1" tls_cuda LOOM_NET=ucx UCX_TLS=tcp,cuda_copy
  one "$1" tls_cuda_lo LOOM_NET=ucx UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo
  one "$1" tls_cuda_eth LOOM_NET=ucx UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES="$eth"
  one "$1" tls_cuda_direct LOOM_NET=ucx UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo LOOM_SOCKET_IFNAME=lo
  one "$1" tls_cuda_probe LOOM_NET=ucx UCX_TLS=tcp,cuda_copy UCX_RNDV_FRAG_MEM_TYPES=host,cuda
}
configs off
loom_start_mps
configs on
echo "Command: scripts/ucx_cuda_check_gpu.sh PREFIX UCX_CUDA OUTDIR" >> "$report"
