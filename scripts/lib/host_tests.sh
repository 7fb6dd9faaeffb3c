# shellcheck shell=bash
# Steps the host tests (tests/comm/*_hosts_test.sh) share (source it). Every rank is a
# loom_rank_check process on this machine claiming a host of its own (LOOM_HOST_ID), its
# bootstrap root on 127.0.0.1:PORT, its output in LOGS/RANK.log; the pids go into the
# caller's `pids` array (for its cleanup trap).
#
#   loom_hosts_start CHECK LOGS PORT N [ENV=VALUE...] [-- CHECK_ARGS...]
#                         starts N ranks with those variables added
#   loom_hosts_wait LOGS N
#                         waits for them; fails where one did, showing each one's last lines
#   loom_hosts_kill CHECK LOGS PORT [ENV=VALUE...]
#                         three hosts check all-reduces in a loop and the third is killed
#                         (kill -9) after 1.5 s: fails unless the other two fail within
#                         17 s of the start with a message that names rank 2

loom_hosts_start() {
  local check=$1 logs=$2 port=$3 n=$4 r
  shift 4
  local vars=() args=()
  while (($#)) && [[ $1 != -- ]]; do vars+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift && args=("$@")
  for ((r = 0; r < n; r++)); do
    env "${vars[@]}" LOOM_COMM_ID="127.0.0.1:$port" LOOM_NRANKS="$n" LOOM_RANK="$r" \
      LOOM_HOST_ID="host$r" "$check" "${args[@]}" > "$logs/$r.log" 2>&1 &
    pids+=($!)
  done
}

loom_hosts_wait() {
  local logs=$1 n=$2 r rc=0
  for ((r = 0; r < n; r++)); do
    if ! wait "${pids[$r]}"; then rc=1; echo "rank $r failed:"; fi
    tail -n 3 "$logs/$r.log"
  done
  pids=()
  return $rc
}

loom_hosts_kill() {
  local check=$1 logs=$2 port=$3 r rc=0 start took
  shift 3
  start=$(date +%s)
  loom_hosts_start "$check" "$logs" "$port" 3 "$@" -- --loop 20
  sleep 1.5
  kill -9 "${pids[2]}"
  for r in 0 1; do
    if wait "${pids[$r]}"; then rc=1; echo "rank $r did not notice rank 2's death"; fi
    grep -h "failed" "$logs/$r.log" | tail -n 1 | cut -c1-300
    grep -q "rank 2" "$logs/$r.log" || { echo "rank $r's error does not name rank 2:"; tail -n 3 "$logs/$r.log"; rc=1; }
  done
  took=$(( $(date +%s) - start ))
  echo "survivors done ${took} s after the start (kill at 1.5 s)"
  (( took <= 17 )) || { echo "too slow"; rc=1; }
  pids=()
  return $rc
}
