# shellcheck shell=bash
# Shared set-up for scripts/run.sh, scripts/test.sh and scripts/compare_ompi.sh.
# Source it (bash only); it defines functions and LOOM_ROOT, and changes nothing else.
#
#   loom_setup                  install missing packages (root, Debian/Ubuntu) or say which
#                               are missing and exit 1 (not root)
#   loom_configure DIR ARGS...  configure DIR with Ninja (Release, CUDA where nvcc exists,
#                               ccache where present); retries without CUDA if that fails
#   loom_build DIR TARGETS...   build with at most LOOM_JOBS (default 2) jobs

LOOM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOOM_JOBS="${LOOM_JOBS:-2}"

# Debian/Ubuntu packages the scripts need. A tool counts as present when its command is on
# PATH however it was installed (a pip cmake, say). ccache (faster rebuilds), iproute2
# (interfaces in the summary; network-namespace tests skip without it) and clang (the
# sanitizer passes of scripts/test.sh: TSan needs it, ASan+UBSan falls back to GCC) are
# optional: when they cannot be installed the scripts go on without them.
LOOM_PACKAGES=(cmake ninja-build g++ pkg-config ccache libgtest-dev libbenchmark-dev
  libpugixml-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin libibverbs-dev libucx-dev iproute2 clang)
LOOM_OPTIONAL_PACKAGES=" ccache iproute2 clang "

loom_log() { printf '[loom] %s\n' "$*" >&2; }
loom_die() { printf '[loom] error: %s\n' "$*" >&2; exit 1; }

loom_is_root() { [[ "$(id -u)" -eq 0 ]]; }

# The command that stands for a package, if it is a tool.
loom_package_command() {
  case "$1" in
    cmake) echo cmake ;;
    ninja-build) echo ninja ;;
    g++) echo g++ ;;
    pkg-config) echo pkg-config ;;
    ccache) echo ccache ;;
    openmpi-bin) echo mpirun ;;
    iproute2) echo ip ;;
    clang) echo clang++ ;;
    clang-format) echo clang-format ;;
  esac
}

# Prints the packages of LOOM_PACKAGES (plus any given) that are missing.
loom_missing_packages() {
  local p c
  for p in "${LOOM_PACKAGES[@]}" "$@"; do
    c="$(loom_package_command "$p")"
    if [[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1; then continue; fi
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null; then
      printf '%s\n' "$p"
    fi
  done
}

# Only optional packages in the list given?
loom_only_optional() {
  local p
  for p in "$@"; do
    [[ "$LOOM_OPTIONAL_PACKAGES" == *" $p "* ]] || return 1
  done
}

# Installs what is missing (root) or says what to install and exits 1 (not root).
# LOOM_SKIP_SETUP=1 skips this (dependencies installed some other way).
loom_setup() {
  if [[ "${LOOM_SKIP_SETUP:-0}" == 1 ]]; then
    loom_log "LOOM_SKIP_SETUP=1: not checking packages"
    loom_check_cmake_version
    return 0
  fi
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    loom_log "not a Debian/Ubuntu system: install these yourself (or their equivalents):"
    loom_log "  ${LOOM_PACKAGES[*]}"
    local c
    for c in cmake ninja g++; do
      command -v "$c" >/dev/null 2>&1 || loom_die "'$c' is not installed"
    done
    loom_check_cmake_version
    return 0
  fi
  local missing
  mapfile -t missing < <(loom_missing_packages "$@")
  if ((${#missing[@]} > 0)); then
    if loom_is_root; then
      # apt's output goes to a log of its own; the terminal gets one line per step.
      local aptlog="${TMPDIR:-/tmp}/loom-setup.log"
      loom_log "installing: ${missing[*]} (apt-get's output: $aptlog)"
      export DEBIAN_FRONTEND=noninteractive
      # Update the lists only when something is missing (a second run stays offline).
      if ! { apt-get update -qq >"$aptlog" 2>&1 &&
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1; }; then
        if loom_only_optional "${missing[@]}"; then
          loom_log "could not install ${missing[*]} (optional); going on without (see $aptlog)"
        else
          tail -n 20 "$aptlog" >&2
          loom_die "apt-get could not install: ${missing[*]}; the whole log is $aptlog"
        fi
      fi
    elif loom_only_optional "${missing[@]}"; then
      loom_log "optional packages missing: ${missing[*]} (sudo apt-get install -y ${missing[*]})"
    else
      loom_log "missing packages: ${missing[*]}"
      loom_log "install them with:"
      printf '  sudo apt-get install -y %s\n' "${missing[*]}" >&2
      loom_log "(or run this script as root, which installs them itself)"
      exit 1
    fi
  fi
  loom_check_cmake_version
}

loom_check_cmake_version() {
  local v
  v="$(cmake --version | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')"
  if ! printf '3.25\n%s\n' "$v" | sort -V -C; then
    loom_die "cmake $v is too old (loom needs 3.25 or newer): 'pip install cmake' or Kitware's apt repository (apt.kitware.com) has one"
  fi
}

# Prints the path of nvcc, or nothing.
loom_find_nvcc() {
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo /usr/local/cuda/bin/nvcc
  elif command -v nvcc >/dev/null 2>&1; then
    command -v nvcc
  fi
}

# Prints the number of GPUs nvidia-smi lists (0 without nvidia-smi or a driver).
loom_gpu_count() {
  local n=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  fi
  echo "${n:-0}"
}

# loom_configure DIR [CMAKE ARGS...]
# Configures DIR as a Ninja Release build. CUDA is on when nvcc exists, unless the caller
# passes -DLOOM_WITH_CUDA=...; if configuring with CUDA fails, it configures again with
# -DLOOM_WITH_CUDA=OFF. The configure output goes to DIR/configure.log.
loom_configure() {
  local dir="$1"
  shift
  local args=(-S "$LOOM_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release)
  if command -v ccache >/dev/null 2>&1; then
    args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  local cuda=OFF nvcc=""
  if [[ " $* " != *" -DLOOM_WITH_CUDA="* ]]; then
    nvcc="$(loom_find_nvcc)"
    [[ -n "$nvcc" ]] && cuda=ON
    args+=("-DLOOM_WITH_CUDA=$cuda")
    # Name the compiler only on the first configure: changing it later would make CMake
    # throw the cache away.
    if [[ "$cuda" == ON && ! -f "$dir/CMakeCache.txt" ]]; then
      args+=("-DCMAKE_CUDA_COMPILER=$nvcc")
    fi
  fi
  mkdir -p "$dir"
  loom_log "configuring $dir (CUDA ${cuda/OFF/off}${nvcc:+ with $nvcc})"
  if cmake "${args[@]}" "$@" >"$dir/configure.log" 2>&1; then
    return 0
  fi
  if [[ "$cuda" == ON ]]; then
    loom_log "configuring with CUDA failed (see $dir/configure.log.cuda); configuring with -DLOOM_WITH_CUDA=OFF"
    cp "$dir/configure.log" "$dir/configure.log.cuda"
    args=("${args[@]/-DLOOM_WITH_CUDA=ON/-DLOOM_WITH_CUDA=OFF}")
    if cmake "${args[@]}" "$@" >"$dir/configure.log" 2>&1; then
      return 0
    fi
  fi
  tail -n 40 "$dir/configure.log" >&2
  loom_log "configuring $dir failed; the whole log is $dir/configure.log"
  return 1
}

# True when DIR holds a configured Ninja build.
loom_configured() { [[ -f "$1/build.ninja" && -f "$1/CMakeCache.txt" ]]; }

# True when the configured build DIR defines TARGET.
loom_has_target() {
  ninja -C "$1" -t targets all 2>/dev/null | grep "^$2: " >/dev/null
}

# loom_build DIR [TARGETS...]
loom_build() {
  local dir="$1"
  shift
  loom_log "building $dir${*:+ ($*)} with -j$LOOM_JOBS"
  if (($# > 0)); then
    cmake --build "$dir" -j "$LOOM_JOBS" --target "$@"
  else
    cmake --build "$dir" -j "$LOOM_JOBS"
  fi
}

# Lets Open MPI's mpirun run as root and oversubscribe the cores (CI runs as root on a
# 2-core machine; tests and benchmarks start 4 ranks). Values already set are kept.
loom_mpi_env() {
  if loom_is_root; then
    export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
    export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
  fi
  export OMPI_MCA_rmaps_base_oversubscribe="${OMPI_MCA_rmaps_base_oversubscribe:-1}"
}

# Prints seconds as "12m03s".
loom_duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
