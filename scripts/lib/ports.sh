# shellcheck shell=bash
# A TCP port for a test's bootstrap root (source it):
#
#   port=$(loom_free_port)
#
# Taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768 up by
# default), where the outgoing connections of tests running beside this one take their
# ports, and not one that something already listens on. Another test may still pick the
# same one between this check and its bind: the odds are one in several thousand.

loom_free_port() {
  local low=32768 p i
  [[ -r /proc/sys/net/ipv4/ip_local_port_range ]] && read -r low _ < /proc/sys/net/ipv4/ip_local_port_range
  ((low > 21000)) || low=32768  # a range starting low leaves no room below it; use the default's
  for ((i = 0; i < 50; ++i)); do
    p=$((20000 + RANDOM % (low - 20000)))
    if command -v ss >/dev/null; then
      [[ -z $(ss -Htan "sport = :$p" 2>/dev/null) ]] && { echo "$p"; return 0; }
    else
      echo "$p"; return 0
    fi
  done
  echo "$p"
}
