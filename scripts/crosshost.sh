#!/usr/bin/env bash
# scripts/crosshost.sh PREFIX OUTDIR [HOSTS...]
#
# GPU buffers across hosts on one GPU machine: HOSTS processes (default: 2 and then 4), all
# on GPU 0, each claiming a host of its own (LOOM_HOST_ID / NCCL_HOSTID per process,
# NCCL_TESTS_DEVICE=0), so that every byte between them goes over the network transports
# (loopback TCP), beside NVIDIA's NCCL (its Socket transport) in the same run:
#   sockets  scripts/bench/tcp_ring_probe.cc, the processes pushing bytes around a ring
#            of loopback sockets (1 MiB sends), no GPU: what the kernel carries then
#   loom     every perf binary under mpirun, -c 1, 8 B to 128 MiB, --compare nccl
#   graphs   all_reduce captured in CUDA graphs (-G 10), and the host time per call (-C 1)
#   PyTorch  tests/gpu/torch_smoke.sh --bench --as-hosts on loom and on PyTorch's NCCL
#            (2 hosts; skipped without PyTorch)
# under CUDA MPS (started here where the machine has it, and stopped at the end): without
# it the processes take turns on the GPU in time slices, and every waiting kernel looks
# slow. Writes OUTDIR/crosshost.md (the table, the machine, the date, the commands), the
# logs, and each rank's loom log (LOOM_DEBUG=INFO, subsystem NET: the CPU of the proxy
# thread and of the socket helper threads).
#
# PREFIX is an install tree (cmake --install build --prefix PREFIX) built with MPI; a
# PREFIX/bin/tcp_ring_probe is used as it is, otherwise the probe is compiled here.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). LOOM_COMMIT names the commit in the
# report where the tree's .git is not the one it was built from (a copied working tree).
set -u
prefix=$(cd "$1" && pwd)
out=$2
shift 2
hosts=("$@")
((${#hosts[@]} > 0)) || hosts=(2 4)
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
bin=$prefix/bin
source "$here/lib/gpu_hosts.sh"
loom_start_mps
probe=$(loom_ring_probe "$bin" "$out" "$here") || exit 1
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0 -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=INIT,NET)
colls="all_reduce all_gather broadcast reduce_scatter reduce alltoall sendrecv"
# sendrecv in place (nccl-tests' definition: the send and receive buffers are one) sends
# from the buffer that the receive from the other side overwrites: a race in any library,
# so its in-place column can show wrong values on either.
{
  echo "# Cross-host collectives on one GPU (processes as hosts)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nvidia-smi -L | head -n1); $(nproc) cores; commit" \
       "${LOOM_COMMIT:-$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo '?')}"
  echo
  echo "Every process on GPU 0, a host of its own (LOOM_HOST_ID/NCCL_HOSTID), under CUDA MPS;"
  echo "loopback TCP. Float sum where the collective reduces, out-of-place busbw (GB/s), -c 1;"
  echo "NCCL is NVIDIA's, its Socket transport, in the same run (--compare nccl)."
  echo
} > "$out/crosshost.md"
for n in "${hosts[@]}"; do
  echo "=== $n hosts: bare sockets"
  "$probe" -n "$n" -b 64M -p 1M -w 3 -i 10 > "$out/probe_$n.log" 2>&1
  cat "$out/probe_$n.log"
  {
    echo "## $n hosts"
    echo
    echo "Bare sockets (\`tcp_ring_probe -n $n -b 64M -p 1M -w 3 -i 10\`): $(tail -n1 "$out/probe_$n.log")"
    echo
    echo "| collective | size | loom us | loom busbw | NCCL us | NCCL busbw | ratio | wrong (loom out-of-place / in-place; NCCL out / in) |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  } >> "$out/crosshost.md"
  for c in $colls; do
    log=$out/${c}_$n.log
    echo "=== $n hosts: $c"
    loom_as_hosts 600 "$n" "$out/${c}_$n" "$bin/${c}_perf" -b 8 -e 128M -f 8 -c 1 -n 20 -w 5 --compare nccl > "$log" 2>&1
    echo "rc=$?"
    # Rows: size count type redop root time algbw busbw #wrong (in-place) ... NCCL time busbw #wrong ratio ...
    awk -v c="$c" '/^ +[0-9]+ +[0-9]+ / {
      printf "| %s | %s | %s | %s | %s | %s | %s | %s / %s; %s / %s |\n", c, $1, $6, $8, $14, $15, $17, $9, $13, $16, $20
    }' "$log" | tee -a "$out/crosshost.md"
  done
  cpu=$(grep -h "network proxy thread used" "$out"/*_"$n".loom.*.log 2>/dev/null |
        sed -E 's/.*\(([0-9.]+) cores in all\).*/\1/' | sort -n | uniq -c | awk '{printf "%s%s", (NR>1?", ":""), $2}')
  {
    echo
    echo "CPU of the proxy and socket helper threads per process, averaged over each whole run"
    echo "(cores; one figure per process and collective, smallest to largest): ${cpu:-not logged}"
    echo
  } >> "$out/crosshost.md"
  echo "=== $n hosts: all_reduce in CUDA graphs, host time per call"
  loom_as_hosts 600 "$n" "$out/graph_$n" "$bin/all_reduce_perf" -b 1M -e 64M -f 8 -c 1 -n 10 -w 3 -G 10 --compare nccl \
    > "$out/graph_$n.log" 2>&1
  loom_as_hosts 600 "$n" "$out/cputime_$n" "$bin/all_reduce_perf" -b 8 -e 128M -f 16 -c 0 -n 20 -w 3 -C 1 \
    > "$out/cputime_$n.log" 2>&1
  {
    echo "all_reduce captured in CUDA graphs (\`-G 10\`, -c 1), out-of-place busbw GB/s, loom / NCCL:"
    awk '/^ +[0-9]+ +[0-9]+ / { printf "%s B: %s / %s (%d wrong); ", $1, $8, $15, $9 + $13 + $16 }' "$out/graph_$n.log"
    echo
    echo
    echo "Host time per all_reduce call (\`-C 1\`, the caller's thread, microseconds), by size:"
    awk '/^ +[0-9]+ +[0-9]+ / { printf "%s B: %s; ", $1, $6 }' "$out/cputime_$n.log"
    echo
    echo
  } >> "$out/crosshost.md"
done
torch=$here/../tests/gpu/torch_smoke.sh
if [ -f "$torch" ]; then
  echo "=== PyTorch, 2 hosts"
  bash "$torch" "$prefix/lib/libnccl.so.2" --bench --as-hosts > "$out/torch_loom.log" 2>&1
  trc=$?
  bash "$torch" none --bench --as-hosts > "$out/torch_nccl.log" 2>&1
  nrc=$?
  {
    echo "## PyTorch, 2 processes as 2 hosts (\`tests/gpu/torch_smoke.sh LIB --bench --as-hosts\`)"
    echo
    if [ $trc = 77 ] || [ $nrc = 77 ]; then
      echo "Skipped: $(head -n1 "$out/torch_loom.log")"
    else
      echo "| measure | loom | PyTorch's NCCL |"
      echo "| --- | --- | --- |"
      paste <(grep '^bench' "$out/torch_loom.log") <(grep '^bench' "$out/torch_nccl.log") |
        awk -F'\t' '{ split($1, a, ": "); split($2, b, ": "); printf "| %s | %s | %s |\n", a[1], a[2], b[2] }'
      echo
      echo "Checks: loom $(tail -n1 "$out/torch_loom.log"), NCCL $(tail -n1 "$out/torch_nccl.log")."
    fi
    echo
  } >> "$out/crosshost.md"
fi
{
  echo "Commands: \`scripts/crosshost.sh PREFIX OUTDIR ${hosts[*]}\`, which runs, per host count N and"
  echo "collective C: \`mpirun -np N ... bash -c 'LOOM_HOST_ID=host\$RANK NCCL_HOSTID=host\$RANK C_perf"
  echo "-b 8 -e 128M -f 8 -c 1 -n 20 -w 5 --compare nccl'\` with NCCL_TESTS_DEVICE=0."
} >> "$out/crosshost.md"
echo "wrote $out/crosshost.md"
