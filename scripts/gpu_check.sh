#!/usr/bin/env bash
# Runs loom's GPU checks and benchmarks on a machine with two or more GPUs, against the
# NCCL found on that machine (--compare nccl), and writes logs, JSON reports and tables
# to OUTDIR.
#
#   scripts/gpu_check.sh PREFIX OUTDIR [quick|check|bench|all|tune|final|large|sanitize|reduce] [TARBALL_DIR]
#
# PREFIX is an install tree (`cmake --install build --prefix PREFIX`) with the GPU test
# binaries (build/tests/gpu/gpu_collectives_test, gpu_registration_test) copied into
# PREFIX/bin. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
#   quick  the GPU test suites (and PyTorch on loom where PyTorch is installed), and one
#          all_reduce sweep with the comparison
#   check  every perf binary with -c 1 from 8 B to 8 GiB (float sum), all types and ops
#          at a few sizes, one process with all GPUs (-g N) and one process per GPU (mpirun);
#          under mpirun with registered buffers (-R 1), and both ways with P2P off (over the network)
#   bench  every perf binary, 8 B to 8 GiB, timed beside NCCL, JSON in OUTDIR
#   tune   all_reduce, all_gather and broadcast over LOOM_P2P_BLOCKS / SLOT_BYTES / LOOM_ALGO
#   final  what docs/perf/h200x2.md records, in the order that matters if time runs out:
#          the test suite, the timed sweeps beside NCCL (with the plot and tables), then
#          the -c 1 checks (-g N 8 B - 1 GiB by 8x, mpirun 8 B - 128 MiB by 64x, all types and ops);
#          OUTDIR is packed into TARBALL_DIR/results.tgz after every phase.
#   large  the largest checks: every perf binary with -c 1 at 8 GiB (-g N; 26-41 s each on the
#          H200 pair, most of it host-side filling and checking) and at 1 GiB under mpirun
#   sanitize compute-sanitizer's memcheck, initcheck, synccheck and racecheck over every perf
#          binary with -c 1 (8 B - 64 MiB, 2 and 3 ranks, LL128 forced, the two-shot reduce;
#          the types and ops and the chunked all-reduce under memcheck) and two GPU tests; runs on one GPU
#          too, its ranks sharing it (LOOM_P2P_SHARE_GPU); sanitize.md sums it up
#   reduce the two-shot reduce of ranks of one process (LOOM_P2P_TWOSHOT_REDUCE_BYTES) against
#          the default forms and NCCL: reduce_perf -g N from 1 to 64 MiB, three interleaved
#          rounds of each, a table of out-of-place times and busbw ratios (reduce_table.md),
#          then its -c 1 checks (all types and ops, and 8 B - 1 GiB)
set -u
prefix=$(cd "$1" && pwd)
out=$2
mode=${3:-all}
tardir=${4:-}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
pack() { [ -n "$tardir" ] && tar czf "$tardir/results.tgz" -C "$out" . ; return 0; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
bin=$prefix/bin
ngpu=$(nvidia-smi -L | wc -l)
colls="all_reduce all_gather broadcast reduce_scatter reduce alltoall sendrecv"
# --bind-to none: with fewer processes than cores Open MPI binds each to one core, and the
# harness's fill and check threads (-c 1) then share it: 8 GiB rows took more than 80 s
# each, 17-29 s unbound (2 x H200, 2026-11-30).
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ngpu" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
status=0

run() {  # name, command...: logs to OUTDIR/name.log, prints the last lines
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  last_rc=$rc
  echo "=== $name: rc=$rc, $((SECONDS - t0)) s"
  [ $rc -ne 0 ] && { status=1; tail -n 15 "$out/$name.log"; }
  return 0
}

{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
"$bin/loom-topo" > "$out/loom-topo.txt" 2>&1
"$bin/loom-topo" --format xml > "$out/loom-topo.xml" 2>&1

if [ "$mode" = quick ] || [ "$mode" = check ] || [ "$mode" = all ]; then
  run gpu_test "$bin/gpu_collectives_test"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/gpu_test.log"
  if [ -x "$bin/gpu_registration_test" ]; then
    run gpu_registration_test "$bin/gpu_registration_test"
    grep -E "^\[  (PASSED|FAILED) " "$out/gpu_registration_test.log"
  fi
  # PyTorch's NCCL backend on loom (skips without PyTorch).
  run torch_smoke bash -c 'bash "$0" "$1" --bench; rc=$?; [ "$rc" = 77 ] && rc=0; exit $rc' \
    "$here/../tests/gpu/torch_smoke.sh" "$prefix/lib/libnccl.so.2"  # 77: skipped, no PyTorch
  grep -E "bench|PASS|FAIL|SKIP" "$out/torch_smoke.log"
fi
if [ "$mode" = quick ]; then
  run quick_all_reduce "$bin/all_reduce_perf" -g "$ngpu" -b 8 -e 1G -f 4 -c 1 -w 5 -n 20 --compare nccl
  tail -n 25 "$out/quick_all_reduce.log"
  run quick_mpi_all_reduce "${mpi[@]}" "$bin/all_reduce_perf" -b 8 -e 256M -f 8 -c 1 -w 5 -n 20 --compare nccl
  tail -n 16 "$out/quick_mpi_all_reduce.log"
fi
if [ "$mode" = check ] || [ "$mode" = all ]; then
  for c in $colls; do
    run "check_${c}_g" "$bin/${c}_perf" -g "$ngpu" -b 8 -e 8G -f 4 -c 1 -w 1 -n 1
    run "check_${c}_mpi" "${mpi[@]}" "$bin/${c}_perf" -b 8 -e 8G -f 4 -c 1 -w 1 -n 1
    run "check_${c}_types" "$bin/${c}_perf" -g "$ngpu" -b 1K -e 4M -f 64 -c 1 -w 1 -n 1 -d all -o all
    # Registered buffers between processes (the pulled all-reduce and reduce read them in place).
    run "check_${c}_mpi_registered" "${mpi[@]}" "$bin/${c}_perf" -R 1 -b 8 -e 1G -f 64 -c 1 -w 1 -n 1
    # P2P off: device buffers over the network (kernels, FIFOs in host memory, the proxy).
    run "check_${c}_g_net" env NCCL_P2P_DISABLE=1 "$bin/${c}_perf" -g "$ngpu" -b 8 -e 64M -f 64 -c 1 -w 1 -n 1
    run "check_${c}_mpi_net" "${mpi[@]}" -x NCCL_P2P_DISABLE=1 "$bin/${c}_perf" -b 8 -e 64M -f 64 -c 1 -w 1 -n 1
  done
  grep -H "Out of bounds values" "$out"/check_*.log
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  for c in $colls; do
    run "bench_${c}" "$bin/${c}_perf" -g "$ngpu" -b 8 -e 8G -f 2 -c 0 -w 5 -n 20 --compare nccl \
      --json "$out/bench_${c}.json"
    grep -iE "avg bus bandwidth|busbw ratio" "$out/bench_${c}.log"
  done
fi
rows() {  # size and out-of-place busbw of a perf log, on one line
  awk '/^ +[0-9]/ {printf "%s:%s ", $1, $8} END {print ""}' "$1"
}
if [ "$mode" = tune ]; then
  for cfg in 32:262144:oneshot 64:262144:oneshot 128:131072:oneshot 128:262144:oneshot \
             64:262144:twoshot 128:262144:twoshot; do
    IFS=: read -r b s a <<< "$cfg"
    run "tune_ar_${b}_${s}_${a}" env LOOM_P2P_BLOCKS=$b LOOM_P2P_SLOT_BYTES=$s LOOM_ALGO=$a \
      "$bin/all_reduce_perf" -g "$ngpu" -b 256K -e 1G -f 4 -c 0 -w 3 -n 10
    echo "all_reduce $cfg: $(rows "$out/tune_ar_${b}_${s}_${a}.log")"
  done
  for cfg in 32:262144 64:262144 128:262144; do
    IFS=: read -r b s <<< "$cfg"
    for c in all_gather broadcast; do
      run "tune_${c}_$b" env LOOM_P2P_BLOCKS=$b LOOM_P2P_SLOT_BYTES=$s \
        "$bin/${c}_perf" -g "$ngpu" -b 1M -e 1G -f 8 -c 0 -w 3 -n 10
      echo "$c $cfg: $(rows "$out/tune_${c}_$b.log")"
    done
  done
  run tune_latency_g "$bin/all_reduce_perf" -g "$ngpu" -b 8 -e 128K -f 8 -c 1 -w 10 -n 50
  echo "latency -g: $(awk '/^ +[0-9]/ {printf "%s:%s ", $1, $6} END {print ""}' "$out/tune_latency_g.log")"
  run tune_latency_mpi "${mpi[@]}" "$bin/all_reduce_perf" -b 8 -e 128K -f 8 -c 1 -w 10 -n 50
  echo "latency mpi: $(awk '/^ +[0-9]/ {printf "%s:%s ", $1, $6} END {print ""}' "$out/tune_latency_mpi.log")"
fi
if [ "$mode" = large ]; then
  for c in $colls; do
    run "large_${c}_g" timeout 150 "$bin/${c}_perf" -g "$ngpu" -b 8G -e 8G -c 1 -w 0 -n 1
    pack
  done
  for c in $colls; do
    run "large_${c}_mpi" timeout 120 "${mpi[@]}" "$bin/${c}_perf" -b 1G -e 1G -c 1 -w 0 -n 1
    pack
  done
  grep -H "Out of bounds values" "$out"/large_*.log
fi
if [ "$mode" = sanitize ]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Ranks past the GPUs there are share them: the kernels for 3 ranks run on 2 GPUs or 1.
  export LOOM_P2P_SHARE_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 LOOM_TIMEOUT_MS=60000
  sanitize() {  # name, tool, command...: one line of sanitize.md per run
    local name=$1 tool=$2; shift 2
    run "san_${name}_$tool" timeout 120 "$cs" --tool "$tool" --error-exitcode 3 "$@"
    local f="$out/san_${name}_$tool.log"
    printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$tool" "$last_rc" \
      "$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$f")" \
      "$(awk '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ { w += $9 + $13 } END { print w + 0 }' "$f")" \
      "$(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$f" | sed 's/=* *//' | sort | uniq -c | tr -s ' ' | tr '\n' ';')" \
      >> "$out/sanitize.md"
  }
  { echo "| run | tool | exit status | rows | wrong | summaries |"; echo "| --- | --- | ---: | ---: | ---: | --- |"; } > "$out/sanitize.md"
  for tool in memcheck initcheck synccheck racecheck; do
    for c in $colls; do
      sanitize "g2_$c" $tool "$bin/${c}_perf" -g 2 -b 8 -e 64M -f 8 -c 1 -w 0 -n 1
    done
    LOOM_P2P_TWOSHOT_REDUCE_BYTES=67108864 sanitize g2_reduce_twoshot $tool "$bin/reduce_perf" -g 2 -b 1M -e 64M -f 4 -c 1 -w 0 -n 1
    for c in all_reduce reduce_scatter reduce; do  # LL128 is off by default
      LOOM_PROTO=ll128 sanitize "g2_${c}_ll128" $tool "$bin/${c}_perf" -g 2 -b 8 -e 16M -f 8 -c 1 -w 0 -n 1
    done
    for c in all_reduce reduce_scatter reduce; do
      sanitize "g3_$c" $tool "$bin/${c}_perf" -g 3 -b 8 -e 16M -f 8 -c 1 -w 0 -n 1
    done
    pack
  done
  sanitize g2_all_reduce_chunked memcheck "$bin/all_reduce_perf" -g 2 -b 256M -e 256M -c 1 -w 0 -n 1
  sanitize g2_all_reduce_types memcheck "$bin/all_reduce_perf" -g 2 -b 8 -e 16M -f 16 -c 1 -w 0 -n 1 -d all -o all
  LOOM_P2P_TWOSHOT_REDUCE_BYTES=67108864 sanitize g2_reduce_types memcheck "$bin/reduce_perf" -g 2 -b 8 -e 16M -f 16 -c 1 -w 0 -n 1 -d all -o all
  sanitize gpu_tests memcheck "$bin/gpu_collectives_test" --gtest_filter='*TwoShotReduce*/2ranks:*MoreRanksThanGpusShareThem.*/3ranks'
  unset LOOM_P2P_SHARE_GPU CUDA_DEVICE_MAX_CONNECTIONS LOOM_TIMEOUT_MS
  cat "$out/sanitize.md"
  pack
fi
if [ "$mode" = reduce ]; then
  for i in 1 2 3; do
    for v in 0 67108864; do
      run "reduce_twoshot_${v}_$i" timeout 60 env LOOM_P2P_TWOSHOT_REDUCE_BYTES=$v "$bin/reduce_perf" \
        -g "$ngpu" -b 1M -e 64M -f 2 -c 0 -w 10 -n 50 --compare nccl --json "$out/reduce_twoshot_${v}_$i.json"
    done
    pack
  done
  python3 - "$out" "$here" > "$out/reduce_table.md" <<'PY'
import glob, os, sys
sys.path.insert(0, sys.argv[2])
from plot_perf import load_report  # closes a report cut short by the timeout
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "reduce_twoshot_*.json"))):
    v = os.path.basename(f).split("_")[2]
    for r in load_report(f).get("results", []):
        mine, theirs = r.get("out_of_place") or {}, r.get("nccl_out_of_place") or {}
        ratio = (r.get("bus_bw_ratio") or {}).get("out_of_place")
        rows.setdefault(r["size"], {}).setdefault(v, []).append((mine.get("time"), theirs.get("time"), ratio))
def span(xs):
    xs = [x for x in xs if x is not None]
    return "%.2f-%.2f" % (min(xs), max(xs)) if xs else "-"
print("| size | default forms, us | two-shot reduce, us | NCCL, us | ratio, default | ratio, two-shot |")
print("| ---: | --- | --- | --- | --- | --- |")
for size in sorted(rows):
    d, t = rows[size].get("0", []), rows[size].get("67108864", [])
    print("| %d | %s | %s | %s | %s | %s |" % (size, span([x[0] for x in d]), span([x[0] for x in t]),
          span([x[1] for x in d + t]), span([x[2] for x in d]), span([x[2] for x in t])))
PY
  cat "$out/reduce_table.md"
  export LOOM_P2P_TWOSHOT_REDUCE_BYTES=67108864
  run check_reduce_twoshot_types timeout 60 "$bin/reduce_perf" -g "$ngpu" -b 1M -e 64M -f 8 -c 1 -w 1 -n 1 -d all -o all
  run check_reduce_twoshot_g timeout 100 "$bin/reduce_perf" -g "$ngpu" -b 8 -e 1G -f 8 -c 1 -w 1 -n 1
  run gpu_test_twoshot timeout 120 "$bin/gpu_collectives_test" --gtest_filter='*TwoShotReduce*'
  unset LOOM_P2P_TWOSHOT_REDUCE_BYTES
  grep -H "Out of bounds values" "$out"/check_reduce_twoshot_*.log
  pack
fi
if [ "$mode" = final ]; then
  run gpu_test timeout 120 "$bin/gpu_collectives_test"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/gpu_test.log"
  if [ -x "$bin/gpu_registration_test" ]; then
    run gpu_registration_test timeout 200 "$bin/gpu_registration_test"
  fi
  run torch_smoke timeout 200 bash -c 'bash "$0" "$1" --bench; rc=$?; [ "$rc" = 77 ] && rc=0; exit $rc' \
    "$here/../tests/gpu/torch_smoke.sh" "$prefix/lib/libnccl.so.2"
  pack
  for c in $colls; do
    run "bench_${c}" timeout 90 "$bin/${c}_perf" -g "$ngpu" -b 8 -e 8G -f 2 -c 0 -w 5 -n 20 \
      --compare nccl --json "$out/bench_${c}.json"
    grep -iE "avg bus bandwidth|busbw ratio" "$out/bench_${c}.log"
    pack
  done
  for c in all_reduce reduce_scatter reduce; do  # the goal rows that hold under mpirun too
    run "bench_mpi_$c" timeout 60 "${mpi[@]}" "$bin/${c}_perf" -b 8 -e 1G -f 4 -c 0 -w 10 -n 50 \
      --compare nccl --json "$out/bench_mpi_$c.json"
  done
  python3 "$here/plot_perf.py" --out "$out/h200x2_busbw.png" --title "2 x H200 (NV18), loom vs NCCL 2.28.9" \
    "$out"/bench_{all_reduce,all_gather,broadcast,reduce_scatter,reduce,alltoall,sendrecv}.json > "$out/plot.log" 2>&1
  python3 "$here/plot_perf.py" --table "$out"/bench_*.json > "$out/tables.md" 2>&1
  pack
  # Host-side filling and checking dominate here (GiB of values per rank and row): up to
  # 1 GiB (-e 2G by 8x), to stay inside one call of the device tool (`large` does the 8 GiB rows).
  for c in $colls; do
    run "check_${c}_g" timeout 100 "$bin/${c}_perf" -g "$ngpu" -b 8 -e 2G -f 8 -c 1 -w 1 -n 1
    pack
  done
  for c in $colls; do
    run "check_${c}_mpi" timeout 40 "${mpi[@]}" "$bin/${c}_perf" -b 8 -e 1G -f 64 -c 1 -w 1 -n 1
    run "check_${c}_types" timeout 40 "$bin/${c}_perf" -g "$ngpu" -b 1K -e 4M -f 64 -c 1 -w 1 -n 1 -d all -o all
    pack
  done
  run check_all_reduce_mpi_types timeout 40 "${mpi[@]}" "$bin/all_reduce_perf" -b 1K -e 4M -f 64 -c 1 -w 1 -n 1 -d all -o all
  grep -H "Out of bounds values" "$out"/check_*.log
  pack
fi
exit $status
