#!/usr/bin/env bash
# Two ranks of one host that live in separate PID namespaces (containers of one pod: the
# same hostname and /dev/shm, neither sees the other's pid), over shared memory:
#   1. a healthy job passes (the liveness check must not conclude from a pid it cannot
#      see that its peer has exited);
#   2. a rank killed with SIGKILL mid-run is still reported by the other, within seconds,
#      as having exited.
# Needs root and util-linux's unshare; otherwise it says why and exits 77 (ctest: skipped).
# Usage: pidns_test.sh PATH/TO/loom_rank_check
set -uo pipefail
check="$1"
if [[ $(id -u) -ne 0 ]]; then echo "SKIP: PID namespaces need root"; exit 77; fi
if ! command -v unshare >/dev/null; then echo "SKIP: no unshare (util-linux)"; exit 77; fi
if ! unshare --pid --fork true 2>/dev/null; then echo "SKIP: 'unshare --pid' refused here"; exit 77; fi
tag="/tmp/loom-pidns-$$"
trap 'rm -f $tag.*' EXIT
# A port for the bootstrap root below the kernel's ephemeral range (32768 up), where the
# other tests' own connections take theirs.
run_pair() {  # rank_check args: starts rank 0 here and rank 1 in a PID namespace of its own
  local port=$((20000 + RANDOM % 12000))
  local common=(env LOOM_COMM_ID="127.0.0.1:$port" LOOM_NRANKS=2 LOOM_TIMEOUT_MS=20000
                LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=INIT)
  "${common[@]}" LOOM_RANK=0 "$check" "$@" > "$tag.0" 2>&1 &
  r0=$!
  "${common[@]}" LOOM_RANK=1 unshare --pid --fork --kill-child "$check" "$@" > "$tag.1" 2>&1 &
  r1=$!
}
rc=0
# 1. Healthy: both pass, over shm, for 2 s of all-reduces, rank 1 waiting 300 ms on rank
#    0 now and then (long enough for it to ask whether rank 0 is still there).
for attempt in 1 2 3; do
  run_pair --loop 2 --stagger-ms 300
  wait $r0; a=$?
  wait $r1; b=$?
  # Another program took the port first: try another.
  grep -q "Address already in use" "$tag.0" || break
done
grep -h "passed\|right\|failed\|exited" "$tag.0" "$tag.1"
if ((a != 0 || b != 0)); then echo "FAIL: healthy pair in two PID namespaces (rc $a, $b)"; rc=1; fi
grep -q "via shm" "$tag.0" || { echo "FAIL: the pair did not use shared memory"; grep -h "connected to" "$tag.0"; rc=1; }
# 2. Rank 1 (in the other namespace) killed mid-run: rank 0 must say it has exited.
for attempt in 1 2 3; do
  run_pair --loop 30
  sleep 2
  grep -q "Address already in use" "$tag.0" || break
  kill -KILL $r0 $r1 2>/dev/null
  wait $r0 $r1 2>/dev/null
done
start=$SECONDS
pkill -KILL -P $r1 -f loom_rank_check; kill -KILL $r1 2>/dev/null
wait $r0; a=$?
took=$((SECONDS - start))
grep -h "failed" "$tag.0"
if ((a == 0)); then
  echo "FAIL: rank 0 did not notice that rank 1 was killed"; rc=1
elif ! grep -q "rank 1 .*\(exited\|gone\|closed\)" "$tag.0"; then
  echo "FAIL: rank 0's error does not say rank 1 is gone"; rc=1
elif ((took > 10)); then
  echo "FAIL: rank 0 took $took s to notice"; rc=1
else
  echo "rank 0 reported the killed rank within $took s"
fi
wait $r1 2>/dev/null
exit $rc
