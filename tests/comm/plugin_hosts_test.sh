#!/usr/bin/env bash
# Host-memory collectives between "hosts" through an NCCL network plugin: loom's own
# sockets exported as libnccl-net-loom.so (NCCL's ABI, the newest version it has) and
# loaded back through LOOM_NET_PLUGIN. Each process claims a host of its own
# (LOOM_HOST_ID), so every pair of ranks goes through the plugin.
#   loopback N  N processes on this machine
#   kill        three hosts check all-reduces in a loop and the third is killed (kill -9)
#               after a second and a half: the other two must fail within 15 s with a
#               message that names it
#   missing     LOOM_NET_PLUGIN names a library that is not there: a warning that says
#               so, and the collectives run over loom's own sockets
# Usage: plugin_hosts_test.sh PATH/TO/loom_rank_check PATH/TO/libnccl-net-loom.so MODE [N]
set -uo pipefail
check="$1" plugin="$2" mode="${3:-loopback}" n="${4:-2}"
tag="loomplug$$"
logs="${TMPDIR:-/tmp}/$tag"
mkdir -p "$logs"
[[ "$mode" == missing ]] && plugin=/nonexistent/libnccl-net-gone.so
common=(env LOOM_NET_PLUGIN="$plugin" LOOM_TIMEOUT_MS=30000 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=INIT,NET)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [[ -n "${LOOM_KEEP_LOGS:-}" ]] || rm -rf "$logs"
}
trap cleanup EXIT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../scripts/lib/ports.sh"
source "$here/../../scripts/lib/host_tests.sh"
port=$(loom_free_port)
if [[ "$mode" == kill ]]; then
  loom_hosts_kill "$check" "$logs" "$port" "${common[@]:1}"
  exit $?
fi
loom_hosts_start "$check" "$logs" "$port" "$n" "${common[@]:1}"
rc=0
loom_hosts_wait "$logs" "$n" || rc=1
grep -h "connected to rank" "$logs"/*.log | sed 's/.*loom INFO //' | sort | uniq -c
grep -h "net/plugin\|NET_PLUGIN" "$logs"/*.log | sed 's/.*loom \(INFO\|WARN\) //' | sort -u
if [[ "$mode" == missing ]]; then
  grep -q "no plugin used" "$logs/0.log" || { echo "no warning about the missing plugin"; rc=1; }
  grep -q "connected to rank .* via \(tcp\|net/socket\)" "$logs"/*.log || { echo "no socket connection seen"; rc=1; }
else
  grep -q "connected to rank .* via net/Loom" "$logs"/*.log || { echo "no connection through the plugin seen"; rc=1; }
fi
exit $rc
