#!/usr/bin/env bash
# ncclCommShrink after a host dies: three processes, each a host of its own (the socket
# backend), check all-reduces in a loop; rank VICTIM is killed (kill -9) half a second into it. The
# other two must see their loop fail, make a communicator without it (ncclCommShrink with
# NCCL_SHRINK_ABORT; with REVOKE 1, ncclCommRevoke first and NCCL_SHRINK_DEFAULT), get a right
# all-reduce on it and exit 0, within 30 s.
# Usage: shrink_test.sh PATH/TO/loom_rank_check VICTIM [REVOKE]
set -uo pipefail
check=$1 victim=${2:-2} revoke=${3:-0}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../scripts/lib/ports.sh"
logs=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; [[ -n ${LOOM_KEEP_LOGS:-} ]] || rm -rf "$logs"' EXIT
port=$(loom_free_port)
for r in 0 1 2; do
  env LOOM_COMM_ID="127.0.0.1:$port" LOOM_COMM_SECRET="shrink$$" LOOM_NRANKS=3 \
    LOOM_RANK=$r LOOM_HOST_ID="host$r" LOOM_TIMEOUT_MS=10000 \
    "$check" --loop 30 --shrink-excluding "$victim" --revoke "$revoke" > "$logs/$r.log" 2>&1 &
  pids+=($!)
done
# A watchdog: nothing here may outlive 60 s.
(sleep 60; kill -9 "${pids[@]}") >/dev/null 2>&1 &
watchdog=$!
# The kill comes once every rank is in its loop (slow builds, such as TSan's, take
# longer over the checks before it), at most 40 s from the start.
for _ in $(seq 400); do
  (($(cat "$logs"/[012].log 2>/dev/null | grep -c ": looping$") == 3)) && break
  sleep 0.1
done
sleep 0.5
kill -9 "${pids[$victim]}"
start=$SECONDS
status=0
for r in 0 1 2; do
  ((r == victim)) && continue
  if ! wait "${pids[$r]}"; then
    echo "rank $r failed:"; tail -n 4 "$logs/$r.log"; status=1; continue
  fi
  if ! grep -q "shrunk to rank .* of 2 without rank $victim; all-reduce right" "$logs/$r.log" ||
    { ((revoke)) && ! grep -q "revoked, shrunk" "$logs/$r.log"; }; then
    echo "rank $r did not shrink:"; tail -n 4 "$logs/$r.log"; status=1
  fi
done
kill "$watchdog" 2>/dev/null
took=$((SECONDS - start))
((took <= 30)) || { echo "the survivors took ${took} s"; status=1; }
((status == 0)) && echo "rank $victim killed; the other two shrank and checked an all-reduce in ${took} s"
exit $status
