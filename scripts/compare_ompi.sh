#!/usr/bin/env bash
# scripts/compare_ompi.sh [--repeat N] [--iters N] [--warmup N] [--latency-iters N] [--out FILE]
#
# Host-memory all-reduce, loom against Open MPI, in the same run, 4 ranks on this machine:
#   Open MPI  MPI_Allreduce (float, sum) from scripts/bench/ompi_allreduce.cc, mpirun -np 4,
#             once with its defaults (shared memory) and once with --mca btl tcp,self;
#   loom      all_reduce_perf under mpirun -np 4 (one rank per process, host memory), once
#             with its default transports (shared memory) and once with LOOM_TRANSPORTS=tcp;
#   sockets   scripts/bench/tcp_ring_probe.cc, 4 processes pushing bytes around a loopback
#             TCP ring with no reduction work, right before and after each TCP round: what
#             the kernel alone carries at that moment, as an all-reduce busbw (a reference,
#             not a hard ceiling: its waits and timing differ from both libraries').
# Sizes 8 B, 512 KiB, 2 MiB, 8 MiB, 64 MiB, 128 MiB; each run does WARMUP untimed and ITERS
# timed calls per size, except 8 B (the latency), which does LATENCY_ITERS timed calls
# (default 2000) after as many warm-ups: 20 calls of a few microseconds are mostly the
# scheduler's noise. With --repeat N every configuration runs N times, interleaved, and
# the table shows the median. Writes a markdown table (default docs/perf/host_allreduce.md)
# with the date, the machine and the exact commands.
#
# Environment: BUILD_DIR (default build; all_reduce_perf is built there if missing).
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$LOOM_ROOT"

repeat=3
iters=20
warmup=5
latency_iters=2000
out=docs/perf/host_allreduce.md
while (($# > 0)); do
  case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --latency-iters) latency_iters="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) loom_die "unknown argument '$1' (try --help)" ;;
  esac
done

BUILD_DIR="${BUILD_DIR:-build}"
SIZES=(8 524288 2097152 8388608 67108864 134217728)
LATENCY_SIZE=8  # timed with latency_iters calls
NP=4

loom_setup
loom_mpi_env

# all_reduce_perf, built with MPI.
if ! loom_configured "$BUILD_DIR"; then
  loom_configure "$BUILD_DIR" -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCHMARKS=OFF
fi
loom_build "$BUILD_DIR" all_reduce_perf
perf="$BUILD_DIR/perf_tests/all_reduce_perf"
[[ -x "$perf" ]] || loom_die "$perf was not built"
if ! grep -q '^LOOM_PERF_HAVE_MPI:INTERNAL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  loom_die "$perf was built without MPI (is libopenmpi-dev installed? reconfigure $BUILD_DIR)"
fi

# The Open MPI benchmark (C bindings only: the C++ ones only add warnings).
ompi="$BUILD_DIR/ompi_allreduce"
src=scripts/bench/ompi_allreduce.cc
if [[ ! -x "$ompi" || "$src" -nt "$ompi" ]]; then
  loom_log "compiling $ompi"
  mpicxx -O2 -std=c++17 -DOMPI_SKIP_MPICXX=1 "$src" -o "$ompi"
fi

# The bare-socket reference (plain C++, no MPI).
probe="$BUILD_DIR/tcp_ring_probe"
probe_src=scripts/bench/tcp_ring_probe.cc
if [[ ! -x "$probe" || "$probe_src" -nt "$probe" ]]; then
  loom_log "compiling $probe"
  c++ -O2 -std=c++17 "$probe_src" -o "$probe"
fi
# 12 MiB per process and round is what each rank sends in an 8 MiB all-reduce over 4 ranks;
# a ring with sends of 1 MiB carried the most in trials (2026-12-01: 128 KiB sends, loom's
# piece, 10-25 % less; every process sending to every other, 0-10 % less).
probe_cmd=("$probe" -n "$NP" -b 12M -p 1M -w 3 -i 20)
probe_bytes="12 MiB"  # for the table's text: what -b and -p above say
probe_send="1 MiB"

mpirun_base=(mpirun --allow-run-as-root --oversubscribe -np "$NP")
ompi_cmd_shm=("${mpirun_base[@]}" "$ompi")
# shellcheck disable=SC2054 # "tcp,self" is one argument
ompi_cmd_tcp=("${mpirun_base[@]}" --mca btl tcp,self "$ompi")
loom_args=(-g 1 -c 1 --memory host)
counts_for() {  # SIZE -> "-w W -n N"
  if [[ "$1" == "$LATENCY_SIZE" ]]; then echo "-w $latency_iters -n $latency_iters"; else echo "-w $warmup -n $iters"; fi
}
loom_cmd_shm=("${mpirun_base[@]}" "$perf")
loom_cmd_tcp=("${mpirun_base[@]}" -x LOOM_TRANSPORTS=tcp "$perf")

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
# Each result line: impl mode size time_us busbw wrong round (the probe: "probe tcp sockets 0
# busbw 0 round", twice a round)

run_ompi() {  # MODE
  local mode="$1" cmd
  if [[ "$mode" == shm ]]; then cmd=("${ompi_cmd_shm[@]}"); else cmd=("${ompi_cmd_tcp[@]}"); fi
  local text rest=()
  for size in "${SIZES[@]}"; do [[ "$size" == "$LATENCY_SIZE" ]] || rest+=("$size"); done
  # shellcheck disable=SC2046 # counts_for gives separate words
  text="$("${cmd[@]}" $(counts_for "$LATENCY_SIZE") "$LATENCY_SIZE")" || loom_die "Open MPI run failed: ${cmd[*]}"
  # shellcheck disable=SC2046
  text+=$'\n'"$("${cmd[@]}" $(counts_for "${rest[0]}") "${rest[@]}")" || loom_die "Open MPI run failed: ${cmd[*]}"
  awk -v mode="$mode" -v round="$round" '!/^#/ && NF >= 6 { print "ompi", mode, $1, $3, $5, $6, round }' <<<"$text" >>"$results"
}

run_loom() {  # MODE
  local mode="$1" cmd size text
  if [[ "$mode" == shm ]]; then cmd=("${loom_cmd_shm[@]}"); else cmd=("${loom_cmd_tcp[@]}"); fi
  for size in "${SIZES[@]}"; do
    # shellcheck disable=SC2046 # counts_for gives separate words
    text="$("${cmd[@]}" -b "$size" -e "$size" $(counts_for "$size") "${loom_args[@]}" 2>&1)" || {
      printf '%s\n' "$text" | tail -n 20 >&2
      loom_die "loom run failed: ${cmd[*]} -b $size -e $size ${loom_args[*]}"
    }
    # nccl-tests columns: size count type redop root | time algbw busbw #wrong (out-of-place)
    awk -v mode="$mode" -v size="$size" -v round="$round" \
      '!/^#/ && $1 == size && NF >= 9 { print "loom", mode, $1, $6, $8, $9, round; exit }' \
      <<<"$text" >>"$results"
  done
}

run_probe() {
  local text
  text="$(timeout 120 "${probe_cmd[@]}")" || loom_die "the loopback probe failed: ${probe_cmd[*]}"
  sed -n "s/.*busbw equivalent \\([0-9.]*\\) GB\\/s.*/probe tcp sockets 0 \\1 0 $round/p" <<<"$text" >>"$results"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
start=$SECONDS
for ((round = 1; round <= repeat; ++round)); do
  r=$round
  for mode in shm tcp; do
    [[ "$mode" == tcp ]] && run_probe
    loom_log "round $r/$repeat, $mode: Open MPI"
    run_ompi "$mode"
    loom_log "round $r/$repeat, $mode: loom"
    run_loom "$mode"
    [[ "$mode" == tcp ]] && run_probe
  done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
elapsed=$((SECONDS - start))

# median IMPL MODE SIZE FIELD (4 = time_us, 5 = busbw): the median over the rounds.
median() {
  awk -v i="$1" -v m="$2" -v s="$3" -v f="$4" '$1 == i && $2 == m && $3 == s { print $f }' \
    "$results" | sort -g | awk '{ v[NR] = $1 } END {
      if (NR == 0) { print "nan"; exit }
      if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# ratio_range MODE SIZE: the lowest and highest Open MPI time / loom time over the rounds,
# each round's pair run back to back ("0.71–2.05"; one round: its ratio).
ratio_range() {
  awk -v m="$1" -v s="$2" '$2 == m && $3 == s { t[$1, ++n[$1]] = $4 } END {
      k = n["ompi"] < n["loom"] ? n["ompi"] : n["loom"]
      for (r = 1; r <= k; ++r) {
        if (t["loom", r] <= 0) continue
        x = t["ompi", r] / t["loom", r]
        if (!c++ || x < lo) lo = x
        if (c == 1 || x > hi) hi = x
      }
      if (!c) print "n/a"; else if (c == 1) printf "%.2f", lo; else printf "%.2f–%.2f", lo, hi }' \
    "$results"
}
busbw() {  # SIZE TIME_US -> GB/s, nccl-tests' all-reduce bus bandwidth
  awk -v s="$1" -v t="$2" -v n="$NP" 'BEGIN { if (t > 0) printf "%.6g", s / (t * 1e3) * 2 * (n - 1) / n; else print "nan" }'
}
wrong_total() {
  awk '{ w += $6 } END { print w + 0 }' "$results"
}

human() {  # bytes -> "8 B", "512 KiB", "2 MiB"
  awk -v b="$1" 'BEGIN {
    if (b >= 1048576 && b % 1048576 == 0) printf "%d MiB", b / 1048576
    else if (b >= 1024 && b % 1024 == 0) printf "%d KiB", b / 1024
    else printf "%d B", b }'
}

# The targets of issue 2 (ratio = loom busbw / Open MPI busbw = Open MPI time / loom time).
target() {  # MODE SIZE -> minimum ratio, or "-"
  local mode="$1" size="$2"
  if ((size == 8)); then echo 1.0; return; fi
  if [[ "$mode" == shm ]]; then
    if ((size >= 524288 && size <= 67108864)); then echo 1.5; else echo -; fi
  else
    if ((size >= 8388608 && size <= 67108864)); then
      echo 1.5
    elif ((size >= 524288 && size <= 2097152)); then
      echo 0.9
    else
      echo -
    fi
  fi
}

# The probe's readings: "median (lowest–highest)" GB/s.
reference_text() {
  awk '$1 == "probe" { print $5 }' "$results" | sort -g | awk '{ v[NR] = $1 } END {
      if (NR == 0) { print "n/a"; exit }
      m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.2f (%.2f–%.2f)", m, v[1], v[NR] }'
}
reference_median() { reference_text | awk '{ print $1 }'; }
# share_range IMPL SIZE: IMPL's TCP busbw in each round as a share of that round's two
# probe readings (their mean): "median (lowest–highest)" in %.
share_range() {
  awk -v i="$1" -v s="$2" -v n="$NP" '
    $1 == "probe" { p[$7] += $5; np[$7]++ }
    $1 == i && $2 == "tcp" && $3 == s && $4 > 0 { b[$7] = s / ($4 * 1e3) * 2 * (n - 1) / n }
    END {
      k = 0
      for (r in b) if (np[r] > 0) v[++k] = 100 * b[r] / (p[r] / np[r])
      if (k == 0) { print "n/a"; exit }
      for (x = 1; x <= k; ++x) for (y = x + 1; y <= k; ++y) if (v[y] < v[x]) { t = v[x]; v[x] = v[y]; v[y] = t }
      m = k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
      printf "%.0f (%.0f–%.0f)", m, v[1], v[k] }' "$results"
}

table() {  # MODE
  local mode="$1" size ot lt ob lb ratio tgt verdict share
  local reference="" head="" rule=""
  if [[ "$mode" == tcp ]]; then
    reference="$(reference_median)"
    head=" Open MPI / loom busbw, % of bare sockets (median of rounds, lowest–highest) |"
    rule=" ---: |"
  fi
  echo "| size | Open MPI time (µs) | loom time (µs) | Open MPI busbw (GB/s) | loom busbw (GB/s) | loom / Open MPI | each round | target |$head"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |$rule"
  for size in "${SIZES[@]}"; do
    ot="$(median ompi "$mode" "$size" 4)"
    lt="$(median loom "$mode" "$size" 4)"
    # busbw from the median time (all_reduce_perf prints busbw with two decimals only).
    ob="$(busbw "$size" "$ot")"
    lb="$(busbw "$size" "$lt")"
    ratio="$(awk -v a="$ot" -v b="$lt" 'BEGIN { if (b > 0 && a > 0) printf "%.2f", a / b; else print "n/a" }')"
    tgt="$(target "$mode" "$size")"
    if [[ "$tgt" == - || "$ratio" == n/a ]]; then
      verdict="—"
    elif awk -v r="$ratio" -v t="$tgt" 'BEGIN { exit !(r >= t) }'; then
      verdict="≥ $tgt: met"
    else
      verdict="≥ $tgt: **missed**"
    fi
    share=""
    if [[ -n "$reference" && "$reference" != n/a ]]; then
      share=" $(share_range ompi "$size") / $(share_range loom "$size") |"
    fi
    printf '| %s | %.1f | %.1f | %.3f | %.3f | %s | %s | %s |%s\n' "$(human "$size")" "$ot" "$lt" "$ob" \
      "$lb" "$ratio" "$(ratio_range "$mode" "$size")" "$verdict" "$share"
  done
}

cpu="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
ompi_version="$(mpirun --version 2>/dev/null | head -n1)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
# (its own output, the table, does not count as a change to what was measured; git refuses
# an exclusion outside the repository, so there is none when --out points elsewhere)
exclude=()
case "$(realpath -m "$out")" in "$(realpath "$LOOM_ROOT")"/*) exclude=(":(exclude)$out") ;; esac
git diff --quiet HEAD -- . "${exclude[@]}" 2>/dev/null || commit+=" (with uncommitted changes)"
rest_text="${SIZES[*]:1}"

mkdir -p "$(dirname "$out")"
{
  echo "# Host-memory all-reduce: loom against Open MPI"
  echo
  echo "Written by \`scripts/compare_ompi.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'); do not edit by hand, run the script again."
  echo
  echo "- machine: $(nproc) cores, ${cpu:-unknown CPU}, Linux $(uname -r), $(free -g | awk '/^Mem:/ { print $2 " GiB" }') memory"
  echo "- Open MPI: ${ompi_version:-unknown}; loom: commit $commit, \`$perf\`"
  echo "- $NP ranks (4 processes, oversubscribed where there are fewer cores), host memory, float sum"
  echo "- $warmup warm-up and $iters timed calls per size, but $latency_iters and $latency_iters at $LATENCY_SIZE B (the latency); every configuration ran $repeat time(s), interleaved, and each cell is the median"
  echo "- time is the mean per call averaged over ranks (loom: all_reduce_perf's out-of-place column); busbw = size / time × 2(n−1)/n, nccl-tests' all-reduce formula, computed here from the median time for both; \"loom / Open MPI\" is the ratio of the medians, \"each round\" the lowest and highest ratio of one round's back-to-back pair"
  echo "- load average before: $load_before; after: $load_after (this includes the run's own 4 ranks; a high figure before means the machine was busy and the table is noisy); $elapsed s in all"
  echo "- wrong results reported across all runs: $(wrong_total)"
  echo "- targets (issue 2): shared memory ≥ 1.5 × Open MPI at 512 KiB–64 MiB; TCP ≥ 1.5 × at 8–64 MiB and ≥ 0.9 × at 512 KiB–2 MiB; 8-byte latency no worse than Open MPI's"
  echo
  echo "## Shared memory (both libraries' defaults)"
  echo
  table shm
  echo
  echo "## TCP only (Open MPI \`--mca btl tcp,self\`, loom \`LOOM_TRANSPORTS=tcp\`)"
  echo
  echo "Bare sockets: \`$probe_src\` ($NP processes in a TCP ring over loopback, each sending $probe_bytes a round in $probe_send sends while receiving as much, cache-resident buffers, no reduction) ran before and after every TCP round and carried the equivalent of $(reference_text) GB/s of all-reduce busbw (its total rate divided by $NP: an all-reduce of S bytes over $NP ranks moves at least 2($NP−1)·S through the sockets). It is a reference for what the kernel alone carries at that moment, not a hard ceiling (its waits and timing differ from both libraries'); the last column sets each round's busbw against the mean of that round's two readings. A library near 100 % of it is limited by the kernel's socket work, and where Open MPI reaches two thirds of it, 1.5 × Open MPI asks for more than bare sockets carry."
  echo
  table tcp
  echo
  echo "## Commands"
  echo
  echo '```sh'
  echo "mpicxx -O2 -std=c++17 -DOMPI_SKIP_MPICXX=1 $src -o $ompi"
  echo "# shared memory"
  echo "${ompi_cmd_shm[*]} $(counts_for "$LATENCY_SIZE") $LATENCY_SIZE"
  echo "${ompi_cmd_shm[*]} $(counts_for 0) $rest_text"
  echo "${loom_cmd_shm[*]} -b $LATENCY_SIZE -e $LATENCY_SIZE $(counts_for "$LATENCY_SIZE") ${loom_args[*]}"
  echo "for s in $rest_text; do ${loom_cmd_shm[*]} -b \$s -e \$s $(counts_for 0) ${loom_args[*]}; done"
  echo "# TCP only (and, before and after each round, bare sockets)"
  echo "c++ -O2 -std=c++17 $probe_src -o $probe"
  echo "${probe_cmd[*]}"
  echo "${ompi_cmd_tcp[*]} $(counts_for "$LATENCY_SIZE") $LATENCY_SIZE"
  echo "${ompi_cmd_tcp[*]} $(counts_for 0) $rest_text"
  echo "${loom_cmd_tcp[*]} -b $LATENCY_SIZE -e $LATENCY_SIZE $(counts_for "$LATENCY_SIZE") ${loom_args[*]}"
  echo "for s in $rest_text; do ${loom_cmd_tcp[*]} -b \$s -e \$s $(counts_for 0) ${loom_args[*]}; done"
  echo '```'
  echo
  echo "Run as root, the script also sets OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1."
} >"$out"
loom_log "wrote $out"
cat "$out"
