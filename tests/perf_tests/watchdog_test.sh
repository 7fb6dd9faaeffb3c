#!/usr/bin/env bash
# The -T watchdog under mpirun: one rank is stopped (SIGSTOP) mid-run; the other must print
# "Test timeout" with where it was, end the job with status 1 and not crash (two threads once reached
# MPI_Abort together: the watchdog and the timed thread whose communicator it aborted).
# Usage: watchdog_test.sh MPIRUN ALL_REDUCE_PERF
set -u
mpirun=$1 perf=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$mpirun" --allow-run-as-root --oversubscribe -np 2 "$perf" --memory host -b 8 -e 8 -w 10 \
  -n 1000000000 -c 0 -T 2 >"$out" 2>&1 &
job=$!
# Wait for both ranks to be in the timed loop (the table header is printed first).
for _ in $(seq 1 100); do
  grep -q '(elements)' "$out" && break
  sleep 0.1
done
ranks=$(pgrep -P "$job" -f "$(basename "$perf")")
victim=$(echo "$ranks" | tail -n 1)
if [ -z "$victim" ]; then
  echo "no rank process found under mpirun (pid $job)"; cat "$out"; kill "$job"; exit 1
fi
sleep 1
kill -STOP "$victim"
status=0
for _ in $(seq 1 300); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
kill -CONT "$victim" 2>/dev/null
if kill -0 "$job" 2>/dev/null; then
  echo "the job did not end within 30 s of stopping rank pid $victim"; kill -KILL "$job"; status=1
fi
wait "$job"; rc=$?
cat "$out"
echo "exit status $rc"
grep -q 'Test timeout (2s)' "$out" || { echo "no 'Test timeout' line"; status=1; }
# The line says where the job was: which library, collective, size and step.
grep -q 'no progress in loom AllReduce, 8 B out of place: ' "$out" ||
  { echo "the timeout line does not say where the job was"; status=1; }
if grep -q -i 'segmentation fault\|signal 11' "$out"; then echo "a process crashed"; status=1; fi
[ "$rc" -ne 0 ] || { echo "the job ended with status 0"; status=1; }
exit $status
