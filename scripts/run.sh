#!/usr/bin/env bash
# scripts/run.sh [ALL_REDUCE_PERF ARGS...]
#
# The main job, from a fresh Debian/Ubuntu machine: installs what is missing (as root; says
# what to install otherwise), builds loom (Release, into build/), prints a short topology
# summary, then runs all_reduce_perf across 4 local ranks: on GPUs where nvidia-smi lists
# some (one rank per GPU, up to 4), on host memory otherwise (or when the arguments say
# `--memory host`). Extra arguments go to all_reduce_perf, after the defaults, so they
# override them (e.g. `scripts/run.sh -e 8M`).
#
# Environment: BUILD_DIR (default build), LOOM_JOBS (build jobs, default 2).
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$LOOM_ROOT"

BUILD_DIR="${BUILD_DIR:-build}"

loom_setup

# Configure once; later runs only rebuild what changed (Ninja re-runs CMake itself when a
# CMakeLists.txt changes). Tests and benchmarks stay off here unless test.sh has already
# turned them on in this build folder.
if ! loom_configured "$BUILD_DIR"; then
  loom_configure "$BUILD_DIR" -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCHMARKS=OFF
fi
targets=(all_reduce_perf)
loom_has_target "$BUILD_DIR" loom-topo && targets+=(loom-topo)
loom_build "$BUILD_DIR" "${targets[@]}"

perf="$BUILD_DIR/perf_tests/all_reduce_perf"
[[ -x "$perf" ]] || loom_die "$perf was not built"

echo
echo "== topology"
if [[ -x "$BUILD_DIR/tools/loom-topo" ]] && "$BUILD_DIR/tools/loom-topo"; then
  :
else
  [[ -x "$BUILD_DIR/tools/loom-topo" ]] && echo "(loom-topo failed; basic summary instead)"
  echo "cores:      $(nproc)"
  echo "cpu:        $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
  numa="$( (ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null || true) | wc -l)"
  echo "numa nodes: ${numa:-?}"
  if command -v ip >/dev/null 2>&1; then
    echo "interfaces:"
    ip -brief address | sed 's/^/  /'
  else
    echo "interfaces: $(cd /sys/class/net && echo *)"
  fi
fi

ngpus="$(loom_gpu_count)"
echo "gpus:       $ngpus"
# `scripts/run.sh --memory host` on a GPU machine runs the host-memory job (4 ranks).
host_memory=0
prev=""
for a in "$@"; do
  [[ "$prev" == --memory && "$a" == host ]] && host_memory=1
  prev="$a"
done
if ((ngpus > 0 && host_memory == 0)); then
  nranks=$((ngpus < 4 ? ngpus : 4))
  cmd=("$perf" -b 8 -e 128M -f 2 -g "$nranks" -c 1)
  echo
  echo "== all_reduce_perf: $nranks ranks on GPUs"
else
  cmd=("$perf" -b 8 -e 128M -f 2 -g 4 -c 1 --memory host)
  echo
  echo "== all_reduce_perf: 4 ranks on host memory$( ((ngpus > 0)) || echo ' (no GPU)')"
fi
cmd+=("$@")
echo "\$ ${cmd[*]}"
exec "${cmd[@]}"
