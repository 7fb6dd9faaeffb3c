#!/usr/bin/env bash
# ucx_pairs_probe.sh PAIRS BYTES ITERS: how many bytes per second UCX itself carries over
# loopback on this machine, without loom: PAIRS ucx_perftest tag_bw streams at once (one
# server and one client process each, the client sending BYTES-sized tagged messages).
# A 2-host ring over L lanes runs 2L such streams (L each way), and
# `tcp_ring_probe -n 2 -s L` is the bare-socket figure beside it. Prints each stream's GB/s
# (10^9 bytes: ucx_perftest's "MB/s" are 2^20 bytes) and their sum; the sum assumes the
# streams ran at the same time (each runs for ITERS messages). UCX's variables (UCX_TLS, UCX_NET_DEVICES, segment sizes)
# pass through; UCX_TLS defaults to tcp and UCX_NET_DEVICES to lo. ucx_perftest is taken
# from PATH (Debian's and Ubuntu's ucx-utils, or a UCX built by scripts/build_ucx_cuda.sh).
set -u
pairs=${1:-2} bytes=${2:-16777216} iters=${3:-200}
command -v ucx_perftest > /dev/null || { echo "ucx_pairs_probe: no ucx_perftest on PATH"; exit 2; }
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
base=$((20000 + RANDOM % 20000))
for ((i = 0; i < pairs; ++i)); do
  timeout 60 ucx_perftest -p $((base + i)) -t tag_bw -s "$bytes" -n "$iters" -w 10 -f > "$dir/s$i" 2>&1 &
done
sleep 1
for ((i = 0; i < pairs; ++i)); do
  timeout 60 ucx_perftest 127.0.0.1 -p $((base + i)) -t tag_bw -s "$bytes" -n "$iters" -w 10 -f > "$dir/c$i" 2>&1 &
done
wait
total=0
for ((i = 0; i < pairs; ++i)); do
  # -f's line: iterations, latency 50 %ile, average, overall, MB/s average, overall, ...
  mbs=$(awk 'NF == 8 && $1 ~ /^[0-9]+$/ { v = $6 } END { if (v != "") print v }' "$dir/c$i")
  [ -n "$mbs" ] || { echo "ucx_pairs_probe: stream $i gave no result:"; cat "$dir/c$i" "$dir/s$i"; exit 1; }
  gbs=$(awk -v b="$mbs" 'BEGIN { printf "%.3f", b * 1048576 / 1e9 }')
  echo "stream $i: $gbs GB/s"
  total=$(awk -v a="$total" -v b="$gbs" 'BEGIN { printf "%.3f", a + b }')
done
echo "ucx_pairs_probe: $pairs streams of $bytes-byte messages, UCX_TLS=$UCX_TLS: $total GB/s in all"
