#!/usr/bin/env bash
# scripts/fault_times.sh RANK_CHECK [OUT.md]
#
# How long the survivors of a fault wait before their error, on host memory: N ranks of
# tests/comm/rank_check (build/tests/comm/loom_rank_check) loop all-reduces of 1 MiB on
# this machine, then the last rank is killed (SIGKILL) or stopped (SIGSTOP) while the
# others are in their calls. For each case and transport (shm; tcp over loopback, with
# LOOM_SHM_DISABLE=1) it prints, per survivor, the time from the fault to its exit with
# the error, and the CPU it used over that time (from /proc, sampled every 50 ms), as a
# Markdown table (to OUT.md as well when given). LOOM_TIMEOUT_MS is 3000 here: a stopped
# rank is reported at that timeout, plus the up to 80 ms the survivors take to ask every
# rank where it is. A benchmark, not a test: it fails only when a survivor does not end.
# TRANSPORTS (environment, default "shm tcp") chooses the transports; "ucx" runs each rank
# as a host of its own (LOOM_HOST_ID) over the ucx backend (LOOM_NET=ucx, UCX_TLS=tcp).
set -u
check=$(realpath "$1")
out=${2:-}
timeout_ms=3000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
rows=()
status=0
run_case() {  # transport fault nranks
  local transport=$1 fault=$2 n=$3 port=$((20000 + RANDOM % 12000))  # below the ephemeral range
  local envs=(LOOM_COMM_ID=127.0.0.1:$port LOOM_NRANKS=$n LOOM_TIMEOUT_MS=$timeout_ms)
  [ "$transport" = tcp ] && envs+=(LOOM_SHM_DISABLE=1)
  [ "$transport" = ucx ] && envs+=(LOOM_NET=ucx UCX_TLS=tcp)
  local pids=()
  for ((r = 0; r < n; r++)); do
    local host=()
    [ "$transport" = ucx ] && host=(LOOM_HOST_ID="host$r")
    env "${envs[@]}" "${host[@]}" LOOM_RANK=$r "$check" --loop 60 > "$tmp/$r.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
  local victim=${pids[$((n - 1))]}
  declare -A start_cpu last_cpu end_ms
  for ((r = 0; r < n - 1; r++)); do
    start_cpu[$r]=$(cpu_ticks "${pids[$r]}")
    last_cpu[$r]=${start_cpu[$r]}
  done
  local t0
  t0=$(date +%s%3N)
  kill -"$fault" "$victim"
  local left=$((n - 1)) deadline=$((t0 + 30000))
  while ((left > 0)); do
    for ((r = 0; r < n - 1; r++)); do
      [ -n "${end_ms[$r]:-}" ] && continue
      local c
      c=$(cpu_ticks "${pids[$r]}")
      if [ -n "$c" ] && [ -d "/proc/${pids[$r]}" ] && ! grep -q '^State:.*Z' "/proc/${pids[$r]}/status" 2>/dev/null; then
        last_cpu[$r]=$c
      else
        end_ms[$r]=$(date +%s%3N)
        left=$((left - 1))
      fi
    done
    if (($(date +%s%3N) > deadline)); then
      echo "a survivor did not end within 30 s of the fault ($transport, SIG$fault)"
      status=1
      break
    fi
    sleep 0.05
  done
  kill -KILL "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
  for ((r = 0; r < n - 1; r++)); do
    local ms=$(( ${end_ms[$r]:-$(date +%s%3N)} - t0 ))
    local ticks=$(( ${last_cpu[$r]:-0} - ${start_cpu[$r]:-0} ))
    local cores
    cores=$(awk -v t="$ticks" -v hz="$hz" -v ms="$ms" 'BEGIN { printf "%.2f", (ms > 0 ? t / hz / (ms / 1000) : 0) }')
    local why
    why=$(grep -m1 -E "^rank [0-9]+: [a-z -]+ failed: " "$tmp/$r.log" |
          sed -E 's/^rank [0-9]+: [a-z -]+ failed: //; s/; where the ranks are.*//' | cut -c1-110)
    [ -z "$why" ] && why=$(grep -v -m1 -E "^vm:|loom WARN|loom INFO" "$tmp/$r.log" | cut -c1-110)
    rows+=("| $transport | SIG$fault | $n | $r | $ms | $cores | ${why:-no error printed} |")
  done
}
for transport in ${TRANSPORTS:-shm tcp}; do
  for fault in KILL STOP; do
    for n in 2 4; do run_case "$transport" "$fault" "$n"; done
  done
done
{
  echo "Host memory, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), LOOM_TIMEOUT_MS=$timeout_ms;"
  echo "\`scripts/fault_times.sh $(basename "$check")\`. Time from the fault to the survivor's exit"
  echo "with its error, and the CPU it used meanwhile (cores)."
  echo
  echo "| transport | fault | ranks | survivor | ms to error | cores while waiting | its error (cut short) |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} | tee ${out:+"$out"}
exit $status
