#!/usr/bin/env bash
# scripts/model_check_gpu.sh PREFIX OUTDIR [HOSTS...]
#
# The cost model (collectives/cost_model.h) against measured all-reduces of GPU buffers
# across "hosts" that are processes on one GPU machine: HOSTS processes (default 2 and
# then 4), all on GPU 0, each claiming a host of its own (LOOM_HOST_ID, NCCL_TESTS_DEVICE=0),
# so every byte between them goes over loopback TCP, under CUDA MPS (started here where the
# machine has it). For each host count: the bare-socket probe (scripts/bench/tcp_ring_probe,
# with as many sockets and threads per peer as loom's socket backend) gives the network's
# rate, and bench/gpu_staging_probe run by HOSTS processes at once the rate at which each
# one's kernels copy through host memory (they share the GPU's link, as ranks on one GPU
# do); loom-model --net-gbps and --stage-gbps at those rates predicts every algorithm, and
# all_reduce_perf times each one forced (LOOM_ALGO ring, tree, direct, doubling, oneshot) and
# the tuner's own choice, 8 B to 16 MiB, -c 1, in ROUNDS rounds (default 2: every form once,
# then every form again), each form's time the best of its rounds: a launch on a machine
# shared by several "hosts" can run 25 % slower than the one before it, which decided
# between forms a few microseconds apart. The socket probe likewise runs PROBE_ROUNDS times
# (default 3) and gives its best rate. Writes OUTDIR/model_check_gpu.md (measured against
# predicted, scripts/model_table.py) and the raw CSV and logs; and
# OUTDIR/model_check_gpu_loaded.md, the same times priced at the socket and staging rates
# measured while both run (the probes side by side), with the direct pattern's socket rate.
#
# PREFIX is an install tree built with MPI whose bin/ holds gpu_staging_probe and
# tcp_ring_probe (or a compiler is on PATH for the latter). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
prefix=$(cd "${1:?usage: model_check_gpu.sh PREFIX OUTDIR [HOSTS...]}" && pwd)
out=${2:?usage: model_check_gpu.sh PREFIX OUTDIR [HOSTS...]}
shift 2
hosts=("$@")
((${#hosts[@]} > 0)) || hosts=(2 4)
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}"
bin=$prefix/bin
source "$here/lib/gpu_hosts.sh"
[[ -x $bin/gpu_staging_probe ]] || {
  echo "model_check_gpu: no $bin/gpu_staging_probe (a build with CUDA installs it: cmake --install)"
  exit 1
}
loom_start_mps
probe=$(loom_ring_probe "$bin" "$out" "$here") || exit 1
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
     -x NCCL_TESTS_DEVICE=0)
# staging_probes N STEM: the staging rates of N probes at once (as N ranks on one GPU), each
# 1, 2, 4 and 8 blocks writing and reading 1 MiB pieces at once, into OUT/STEM_i.csv; waits
# for those probes only.
staging_probes() {
  local n=$1 stem=$2 at i
  local -a pids=()
  at=$(( $(date +%s) + 5 ))
  for ((i = 0; i < n; ++i)); do
    timeout 120 "$bin/gpu_staging_probe" --blocks 1,2,4,8 --pieces 1048576 --at "$at" --csv \
      > "$out/${stem}_$i.csv" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}
# stage_rates STEM: from OUT/STEM_*.csv, the mean over the processes of each block count's
# rate, each at least the one before (as loom-model takes them); empty if one is missing.
stage_rates() {
  cat "$out"/"$1"_*.csv | awk -F, '$1 != "device" && $1 !~ /^#/ && NF == 6 {
      sum[$2] += $6; cnt[$2]++ }
    END { if (!(cnt[1] && cnt[2] && cnt[4] && cnt[8])) exit
          m = 0
          for (i = 1; i <= 8; i *= 2) {
            r = sum[i] / cnt[i]; if (r > m) m = r
            printf "%s%.2f", (i > 1 ? "," : ""), m } }'
}
measured=$out/measured_gpu.csv
predicted=$out/predicted_gpu.csv
echo "label,nranks,bytes,us_per_call,calls,wrong" > "$measured"
predicted_loaded=$out/predicted_gpu_loaded.csv
echo "coll,hosts,ranks_per_host,bytes,algo,us,busbw_gbps,built,picked,tuner" > "$predicted"
cp "$predicted" "$predicted_loaded"
rates=""
loaded=""
status=0
# As many sockets (each with a thread) per peer as loom's socket backend uses for GPU
# buffers: LOOM_SOCKET_NTHREADS (4 where unset) x LOOM_NSOCKS_PERTHREAD (1).
threads=${LOOM_SOCKET_NTHREADS:-${NCCL_SOCKET_NTHREADS:-4}}
[[ $threads == auto ]] && threads=4
socks=$(( threads * ${LOOM_NSOCKS_PERTHREAD:-${NCCL_NSOCKS_PERTHREAD:-1}} ))
for n in "${hosts[@]}"; do
  # The probe PROBE_ROUNDS times (default 3), its best rate: one run can catch the machine
  # 25 % slower than the next (2-host runs of 8.3 and 11.4 GB/s minutes apart), and the
  # measured times are each form's best round too. Its last line gives the ring's
  # busbw-equivalent rate: "... X GB/s ...".
  : > "$out/probe_$n.log"
  runs=()
  for ((r = 0; r < ${PROBE_ROUNDS:-3}; ++r)); do
    g=$("$probe" -n "$n" -s "$socks" -b 64M -p 1M -w 3 -i 10 2>&1 | tee -a "$out/probe_$n.log" |
      tail -n 1 | grep -oE '[0-9.]+ GB/s' | tail -n 1 | cut -d' ' -f1)
    [[ -n $g ]] && runs+=("$g")
  done
  ((${#runs[@]} > 0)) || { echo "model_check_gpu: no rate from the probe:"; cat "$out/probe_$n.log"; exit 1; }
  gbps=$(printf '%s\n' "${runs[@]}" | sort -g | tail -n 1)
  staging_probes "$n" "stage_$n"
  stage=$(stage_rates "stage_$n")
  [[ -n $stage ]] || { echo "model_check_gpu: no staging rates:"; cat "$out"/stage_"${n}"_*.csv; exit 1; }
  rates+="$n hosts ${gbps} GB/s (the best of ${runs[*]}), staging ${stage} GB/s; "
  "$bin/loom-model" -N "$n" -g 1 --net-gbps "$gbps" --stage-gbps "$stage" -c all_reduce -b 8 -e 16M -f 8 --csv |
    tail -n +2 >> "$predicted"
  # The same rates while both run, as a collective's copies and its sockets do: they share
  # the host's memory and cores. The ring probe runs again and again (5 rounds a run) while
  # the staging probes measure; the mean of its runs is the loaded network rate. And the
  # bare sockets with every process sending to every other (the direct form's traffic).
  # Logged, and priced in a table of their own (model_check_gpu_loaded.md); the main table
  # keeps the rates measured alone.
  "$probe" -n "$n" -s "$socks" -d -b 64M -p 1M -w 3 -i 10 > "$out/probe_direct_$n.log" 2>&1
  direct_gbps=$(tail -n 1 "$out/probe_direct_$n.log" | grep -oE '[0-9.]+ GB/s' | tail -n 1 | cut -d' ' -f1)
  rm -f "$out/loaded_done"
  ( while [[ ! -e $out/loaded_done ]]; do
      "$probe" -n "$n" -s "$socks" -b 64M -p 1M -w 1 -i 5 2>&1 | tail -n 1
    done ) > "$out/probe_loaded_$n.log" &
  ringpid=$!
  staging_probes "$n" "stage_loaded_$n"
  touch "$out/loaded_done"
  wait "$ringpid"
  loaded_gbps=$(grep -oE '[0-9.]+ GB/s$' "$out/probe_loaded_$n.log" | awk '{ s += $1; c++ } END { if (c) printf "%.2f", s / c }')
  loaded_stage=$(stage_rates "stage_loaded_$n")
  loaded+="$n hosts: bare sockets each to every other ${direct_gbps:-?} GB/s alone; while both run, "
  loaded+="the ring ${loaded_gbps:-?} GB/s and staging ${loaded_stage:-?} GB/s; "
  if [[ -n $loaded_gbps && -n $loaded_stage ]]; then
    "$bin/loom-model" -N "$n" -g 1 --net-gbps "$loaded_gbps" --stage-gbps "$loaded_stage" -c all_reduce \
      -b 8 -e 16M -f 8 --csv | tail -n +2 >> "$predicted_loaded"
  fi
  for ((round = 1; round <= ${ROUNDS:-2}; ++round)); do
    for algo in ring tree direct doubling oneshot default; do
      ((n == 2)) && [[ $algo == tree ]] && continue
      ((n & (n - 1))) && [[ $algo == doubling ]] && continue
      env_algo=()
      [[ $algo != default ]] && env_algo=(-x LOOM_ALGO="$algo")
      log=$out/allreduce_${n}_${algo}_r$round.log
      : > "$log"
      # Up to 256 KiB, 200 calls a size (20 let one slow call move a 30 us mean by 15 %);
      # from 2 MiB, 20.
      for sweep in "8 256K 200 20" "2M 16M 20 5"; do
        read -r b e iters warm <<< "$sweep"
        timeout 180 "${mpi[@]}" "${env_algo[@]}" -np "$n" bash -c \
          'export LOOM_HOST_ID=host$OMPI_COMM_WORLD_RANK; exec "$@"' x \
          "$bin/all_reduce_perf" -b "$b" -e "$e" -f 8 -c 1 -n "$iters" -w "$warm" >> "$log" 2>&1 || {
          status=1
          echo "model_check_gpu: $n hosts, $algo, $b to $e failed:"
          tail -n 5 "$log"
        }
      done
      # Rows: size count type redop root time algbw busbw #wrong ...: out-of-place time.
      awk -v a="$algo" -v n="$n" '/^ +[0-9]+ +[0-9]+ / {
          printf "%s,%s,%s,%s,%d,%s\n", a, n, $1, $6, ($1 <= 262144 ? 200 : 20), $9 }' \
        "$log" >> "$measured"
      echo "model_check_gpu: $n hosts, $algo, round $round done"
    done
  done
done
desc="Processes as hosts on one GPU ($(nvidia-smi -L 2>/dev/null | head -n 1 | cut -d'(' -f1)), "
desc+="$(nproc) cores, under CUDA MPS; every byte over loopback TCP. $(date -u '+%Y-%m-%d %H:%M UTC'). "
desc+="all_reduce_perf -c 1 -f 8, -b 8 -e 256K -n 200 -w 20 and -b 2M -e 16M -n 20 -w 5, float sum, out-of-place time per call, the best of ${ROUNDS:-2} rounds (every form once a round). "
desc+="The model's network rate is the bare-socket probe's, the best of ${PROBE_ROUNDS:-3} runs (tcp_ring_probe -n N -s $socks -b 64M -p 1M), "
desc+="its staging rates (1, 2, 4, 8 blocks) gpu_staging_probe's (N at once, --pieces 1048576, both ways at once): ${rates}"
desc+="Each cell: measured / predicted µs (prediction error). \`default\`: LOOM_ALGO unset, the "
desc+="tuner's choice. Written by scripts/model_check_gpu.sh."
python3 "$here/model_table.py" "$measured" "$predicted" gpu \
  "The cost model against measured all-reduces of GPU buffers across hosts" "$desc" \
  > "$out/model_check_gpu.md" || status=1
echo "model_check_gpu: wrote $out/model_check_gpu.md"
if (($(wc -l < "$predicted_loaded") > 1)); then
  python3 "$here/model_table.py" "$measured" "$predicted_loaded" gpu \
    "The same measurements priced at the rates measured while copies and sockets both run" \
    "The measured times of model_check_gpu.md. The model's rates: ${loaded}Written by scripts/model_check_gpu.sh." \
    > "$out/model_check_gpu_loaded.md" || status=1
  echo "model_check_gpu: wrote $out/model_check_gpu_loaded.md"
fi
exit $status
