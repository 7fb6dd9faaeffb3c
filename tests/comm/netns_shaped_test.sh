#!/usr/bin/env bash
# Four "hosts" as network namespaces on one bridge, every link shaped to 1 Gb/s (tc tbf),
# one rank each, recursive doubling forced: 1 MiB all-reduces for a few seconds. Over
# shaped links a socket often takes part of a piece; the rest must still be pushed while
# the rank runs the schedule's next phase (it used to sit there, and the four ranks
# waited on each other within the first calls until LOOM_TIMEOUT_MS).
# Needs root, `ip netns`, a bridge and tc's tbf; otherwise it says why and exits 77.
# Usage: netns_shaped_test.sh PATH/TO/loom_rank_check
set -uo pipefail
check="$1"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../scripts/lib/netns.sh"
tag="ls$$"
trap 'loom_netns_down "$tag" 4' EXIT
loom_netns_up "$tag" 4 1000 || exit $?
port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1 2 3; do
  ip netns exec "${tag}h$r" env LOOM_COMM_ID="198.51.100.10:$port" LOOM_RANK=$r LOOM_NRANKS=4 \
    LOOM_TIMEOUT_MS=20000 LOOM_HOST_ID="host$r" LOOM_ALGO=doubling \
    "$check" --loop 4 > "/tmp/${tag}.$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for r in 0 1 2 3; do
  if ! wait "${pids[$r]}"; then rc=1; echo "rank $r failed:"; fi
  grep -v "LOOM_COMM_SECRET" "/tmp/${tag}.$r.log" | tail -n 3
done
rm -f /tmp/${tag}.*.log
exit $rc
