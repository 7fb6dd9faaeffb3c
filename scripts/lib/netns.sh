# shellcheck shell=bash
# Hosts as network namespaces on one bridge, for tests and measurements (source it):
#
#   loom_netns_up TAG N [RATE_MBIT]   namespaces TAGh0..TAGh(N-1), 198.51.100.(10+i)/24 on
#                                     veths joined by the bridge TAGbr; with RATE, both ends
#                                     of every veth shaped to RATE Mb/s (tc tbf), as a NIC
#                                     of that speed would be. Returns 77 with the reason on
#                                     stdout where root, ip, a bridge, veths or tbf are
#                                     missing or refused.
#   loom_netns_down TAG N             removes them
#
# TEST-NET-2 addresses, only ever inside these namespaces.

loom_netns_up() {
  local tag=$1 n=$2 rate=${3:-} i ns burst
  if [[ $(id -u) -ne 0 ]]; then echo "SKIP: network namespaces need root"; return 77; fi
  command -v ip >/dev/null || { echo "SKIP: no 'ip' command (iproute2)"; return 77; }
  if [[ -n $rate ]]; then command -v tc >/dev/null || { echo "SKIP: no 'tc' command (iproute2)"; return 77; }; fi
  ip link add "${tag}br" type bridge 2>/dev/null || { echo "SKIP: cannot make a bridge here"; return 77; }
  ip link set "${tag}br" up
  # The bucket holds 4 ms at RATE and at least 256 KiB: a veth passes segments of up to
  # 64 KiB (GSO), and tbf holds back for good any packet larger than its bucket (TCP then
  # waits for retransmission timeouts).
  [[ -n $rate ]] && burst=$((rate * 125 * 4)) && ((burst < 262144)) && burst=262144
  for ((i = 0; i < n; ++i)); do
    ns="${tag}h$i"
    ip netns add "$ns" 2>/dev/null || { echo "SKIP: 'ip netns add' refused here"; return 77; }
    ip link add "${tag}v$i" type veth peer name "${tag}p$i" 2>/dev/null || { echo "SKIP: veth refused"; return 77; }
    ip link set "${tag}v$i" netns "$ns"
    ip link set "${tag}p$i" master "${tag}br" up
    ip -n "$ns" addr add "198.51.100.$((10 + i))/24" dev "${tag}v$i"
    ip -n "$ns" link set "${tag}v$i" up
    ip -n "$ns" link set lo up
    if [[ -n $rate ]]; then
      tc -n "$ns" qdisc add dev "${tag}v$i" root tbf rate "${rate}mbit" burst "$burst" latency 200ms 2>/dev/null &&
        tc qdisc add dev "${tag}p$i" root tbf rate "${rate}mbit" burst "$burst" latency 200ms 2>/dev/null ||
        { echo "SKIP: tc tbf refused (no sch_tbf?)"; return 77; }
    fi
  done
  return 0
}

loom_netns_down() {
  local tag=$1 n=$2 i
  for ((i = 0; i < n; ++i)); do ip netns del "${tag}h$i" 2>/dev/null; done
  ip link del "${tag}br" 2>/dev/null
  return 0
}
