#!/usr/bin/env bash
# scripts/ib_gdr_check_gpu.sh PREFIX OUTDIR [SIZES]
#
# GPUDirect RDMA's data path on one GPU machine without an RDMA NIC: 2 processes as 2 hosts
# (LOOM_HOST_ID per process), every rank on GPU 0 (NCCL_TESTS_DEVICE=0), under CUDA MPS,
# all_reduce_perf -c 1 three ways:
#   socket    LOOM_NET=socket (FIFOs in page-locked host memory, loopback TCP)
#   staged    LOOM_NET=ib LOOM_IB_EMULATE=roce: the emulated RDMA device, FIFOs in host memory
#   gdr       LOOM_NET=ib LOOM_IB_EMULATE=roce,gdr: the FIFOs' slots in GPU memory, registered
#             through dma-buf where the driver exports it (else as peer memory); the emulated
#             NIC copies with CUDA where a NIC would DMA
#   flush     gdr with LOOM_NET_FORCE_FLUSH=1: every receive flushed (cuFlushGPUDirectRDMAWrites),
#             as on GPUs that do not order a NIC's writes themselves
# The emulation's figures say nothing of a NIC's speed (one thread per process moves every
# byte); what this shows is that the GPU-memory path is right (#wrong 0) and what the logs
# say was chosen. Writes OUTDIR/gdr.md and the logs.
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
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0 -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=INIT,NET -x LOOM_TIMEOUT_MS=60000)
rows() { awk '/^ +[0-9]+ +[0-9]+ / { print $1, $6, $8, $9 + $13 }' "$1"; }
declare -A env=([socket]="LOOM_NET=socket" [staged]="LOOM_NET=ib LOOM_IB_EMULATE=roce"
                [gdr]="LOOM_NET=ib LOOM_IB_EMULATE=roce,gdr"
                [flush]="LOOM_NET=ib LOOM_IB_EMULATE=roce,gdr LOOM_NET_FORCE_FLUSH=1")
for way in socket staged gdr flush; do
  # shellcheck disable=SC2086
  loom_as_hosts 150 2 "$out/$way" env ${env[$way]} "$bin/all_reduce_perf" $sizes -c 1 -n 10 -w 3 \
    > "$out/$way.log" 2>&1
  echo "$way rc=$?"
done
{
  echo "# GPUDirect RDMA's data path over the emulated RDMA device"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nvidia-smi -L | head -n1); $(nproc) cores; commit" \
       "${LOOM_COMMIT:-$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo '?')}"
  echo
  echo "2 processes as 2 hosts on GPU 0 under CUDA MPS; all_reduce_perf $sizes -c 1, float sum,"
  echo "out-of-place time (us) and busbw (GB/s), #wrong summed over both columns."
  echo
  echo "| size | socket us | socket busbw | staged us | staged busbw | gdr us | gdr busbw | gdr+flush us | gdr+flush busbw | wrong (socket, staged, gdr, flush) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  join <(rows "$out/socket.log") <(rows "$out/staged.log") | join - <(rows "$out/gdr.log") |
    join - <(rows "$out/flush.log") |
    awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s, %s, %s, %s |\n", $1, $2, $3, $5, $6, $8, $9, $11, $12, $4, $7, $10, $13 }'
  echo
  echo "What the logs say (GPU 0, first process):"
  echo
  for way in staged gdr flush; do
    line=$(grep -h "uses ib device" "$out/$way".loom.*.log 2>/dev/null | head -n1 | sed 's/^.*GPU 0/GPU 0/')
    echo "- $way: ${line:-no such line}"
  done
} > "$out/gdr.md"
echo "wrote $out/gdr.md"
