#!/usr/bin/env bash
# scripts/build_ucx_cuda.sh SRC PREFIX
#
# Builds UCX with CUDA support (the cuda_copy and cuda_ipc transports, so that UCX moves
# device buffers itself) from the UCX source tree SRC (a git checkout of openucx/ucx, say at
# tag v1.19.1, the first release built and tested against CUDA 13) and installs it into
# PREFIX, for testing loom's ucx network backend (transports/net/ucx) on a machine whose own
# UCX (Debian's and Ubuntu's libucx0) is built without CUDA. It builds on a machine with the
# CUDA toolkit and no GPU; the result is copied to the GPU machine and used from there:
#
#   copy PREFIX to the GPU machine (it may live anywhere there: UCX finds its transport
#   modules, PREFIX/lib/ucx/libuct_*.so, next to PREFIX/lib/libucs.so), then run loom with
#     LD_LIBRARY_PATH=PREFIX/lib:$LD_LIBRARY_PATH LOOM_NET=ucx ...
#   loom dlopens libucp.so.0 (transports/net/ucx/ucp_calls.cc), which PREFIX/lib provides, and
#   the library path makes that one win over the system's. Leave UCX_TLS unset, or name
#   the transports, e.g. UCX_TLS=tcp,cuda_copy (cuda_ipc too between processes on one host:
#   UCX_TLS=tcp,cuda_copy,cuda_ipc). PREFIX/bin/ucx_info -v says what was built and
#   PREFIX/bin/ucx_info -d lists the transports (the cuda ones only where there is a GPU:
#   without a driver, PREFIX/lib/ucx/libuct_cuda.so does not load, and UCX then says it has
#   no CUDA memory support). The transports module, libuct_cuda.so, needs the driver's
#   libcuda.so.1 and libnvidia-ml.so.1; UCX's CUDA memory hooks, libucm_cuda.so, also need
#   libcudart.so.13 (of the toolkit it was built with): where ldconfig does not know it, add
#   the toolkit's library folder too (LD_LIBRARY_PATH=PREFIX/lib:/usr/local/cuda/lib64:...).
#   (The device machine's run tool carries only ignored paths inside the repository, so a
#   PREFIX meant for it goes under build/, e.g. build/ucx-cuda.)
#
# What it does: installs its build dependencies with apt-get when run as root and they are
# missing (scripts/lib/common.sh's loom_setup; not root: says what to install and exits 1;
# LOOM_SKIP_SETUP=1 skips the check), runs SRC/autogen.sh where SRC has no configure, and
# configures out of tree in UCX_BUILD_DIR (default SRC/build-cuda) a release build (no
# logging, debug code, assertions or parameter checks; thread-safe: --enable-mt) with CUDA
# and without InfiniBand (verbs, rdmacm), Java, Go, docs and the other optional devices
# (options this version of configure does not know are left out), then make -j$(nproc),
# make install, strips the shared objects and programs, and prints the ucx_info -v line, the
# transports ucx_info -d lists here and the CUDA modules installed. It writes only SRC (the
# generated configure, the build directory), PREFIX and, when installing packages, apt's log.
#
# Needs: the CUDA toolkit at CUDA_HOME (default /usr/local/cuda: cuda.h, libcuda's stub,
# libcudart, nvcc), NVIDIA's nvml.h (UCX's configure requires it with --with-cuda): looked
# for in NVML_INCLUDE_DIR, CUDA_HOME/include, /usr/include and /usr/include/nvidia/gdk. The
# CUDA toolkit's cuda-nvml-dev component has it, as does gen/nvml/nvml.h in NVIDIA's go-nvml
# repository (pick the commit that syncs it with your CUDA version). libnvidia-ml.so (for
# linking only: at run time the driver's libnvidia-ml.so.1 is used) is taken from
# CUDA_HOME/lib64/stubs or the system when there is one, else a stub with the functions that
# nvml.h declares is built in the build directory. Debian or Ubuntu for the package install.
# Takes a few minutes on 2 cores (UCX 1.19.1: under 2 minutes). PREFIX is about 5 MiB.
set -euo pipefail

if (($# != 2)); then
  echo "usage: $0 SRC PREFIX" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib/common.sh disable=SC1091
source "$here/lib/common.sh"

src=$(cd "$1" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
[[ -f "$src/configure.ac" && -d "$src/src/ucp" ]] || loom_die "$src is not a UCX source tree"
[[ -f "$cuda/include/cuda.h" ]] || loom_die "no CUDA toolkit at $cuda (set CUDA_HOME)"
mkdir -p "$2"
prefix=$(cd "$2" && pwd)
build=${UCX_BUILD_DIR:-$src/build-cuda}
jobs=$(nproc)
log() { printf '[ucx-cuda] %s\n' "$*" >&2; }
SECONDS=0

# Build dependencies: loom_setup installs what LOOM_PACKAGES names, so name UCX's here, and
# skip its check of cmake, which this build does not use.
# shellcheck disable=SC2034  # read by loom_setup
LOOM_PACKAGES=(autoconf automake libtool make pkg-config gcc g++)
# shellcheck disable=SC2034
LOOM_OPTIONAL_PACKAGES=" "
loom_check_cmake_version() { :; }
# shellcheck disable=SC2119  # no packages beyond LOOM_PACKAGES
loom_setup

# nvml.h, and a libnvidia-ml.so to link against.
nvml_inc=""
for d in ${NVML_INCLUDE_DIR:+"$NVML_INCLUDE_DIR"} "$cuda/include" /usr/include /usr/include/nvidia/gdk; do
  if [[ -f "$d/nvml.h" ]]; then
    nvml_inc=$d
    break
  fi
done
[[ -n "$nvml_inc" ]] || loom_die "nvml.h not found in ${NVML_INCLUDE_DIR:+$NVML_INCLUDE_DIR, }$cuda/include, /usr/include or /usr/include/nvidia/gdk: install the CUDA toolkit's cuda-nvml-dev, or set NVML_INCLUDE_DIR to a folder holding NVIDIA's nvml.h (e.g. gen/nvml of github.com/NVIDIA/go-nvml)"
mkdir -p "$build"
nvml_lib=""
for d in "$cuda/lib64/stubs" "$cuda/lib64" "$cuda/lib/stubs" "$cuda/lib"; do
  if [[ -e "$d/libnvidia-ml.so" ]]; then
    nvml_lib=$d
    break
  fi
done
if [[ -z "$nvml_lib" ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so '; then
  # A stub like the CUDA toolkit's: every function nvml.h declares, in a library named
  # libnvidia-ml.so.1, so that UCX's modules need the driver's library of that name.
  nvml_lib=$build/nvml-stub
  mkdir -p "$nvml_lib"
  log "no libnvidia-ml.so: building a stub for linking in $nvml_lib"
  { grep -oE 'DECLDIR +nvml[A-Za-z0-9_]+ *\(' "$nvml_inc/nvml.h" | sed -E 's/DECLDIR +//; s/ *\($//'
    echo nvmlInit; } | sort -u | sed 's/.*/int &(void) { return 999; }/' > "$nvml_lib/nvml_stub.c"
  gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$nvml_lib/libnvidia-ml.so" "$nvml_lib/nvml_stub.c"
fi
log "nvml.h from $nvml_inc${nvml_lib:+, libnvidia-ml.so from $nvml_lib}"

if [[ ! -x "$src/configure" ]]; then
  log "running autogen.sh in $src"
  (cd "$src" && ./autogen.sh) > "$build/autogen.log" 2>&1 || {
    tail -n 30 "$build/autogen.log" >&2
    loom_die "autogen.sh failed; the whole log is $build/autogen.log"
  }
fi

# Options this configure knows (UCX versions differ): each by its name in configure --help.
help=$("$src/configure" --help)
opts=(--prefix="$prefix" --with-cuda="$cuda")
for o in --disable-static --enable-mt --without-java --without-go --disable-doxygen-doc \
  --disable-logging --disable-debug --disable-assertions --disable-params-check \
  --without-verbs --without-rdmacm --without-knem --without-xpmem --without-rocm \
  --without-ze --without-gdrcopy --without-ugni --without-fuse3; do
  name=${o#--*-}
  if grep -qE -- "--(with|without|enable|disable)-$name([^a-z0-9-]|$)" <<<"$help"; then
    opts+=("$o")
  else
    log "configure does not know $o: leaving it out"
  fi
done
cppflags="-I$nvml_inc${CPPFLAGS:+ $CPPFLAGS}"
ldflags="${nvml_lib:+-L$nvml_lib}${LDFLAGS:+ $LDFLAGS}"
log "configuring in $build: ${opts[*]}"
(cd "$build" && "$src/configure" "${opts[@]}" CPPFLAGS="$cppflags" LDFLAGS="$ldflags") \
  > "$build/configure.log" 2>&1 || {
  tail -n 30 "$build/configure.log" >&2
  loom_die "configure failed; see $build/configure.log and $build/config.log"
}
grep -q '^#define HAVE_CUDA 1' "$build/config.h" || loom_die "configure left CUDA out; see $build/config.log"
grep -E 'Supported transports|CUDA modules' "$build/configure.log" >&2 || true

log "building with -j$jobs (output: $build/make.log)"
make -C "$build" -j"$jobs" > "$build/make.log" 2>&1 || {
  tail -n 40 "$build/make.log" >&2
  loom_die "make failed; the whole log is $build/make.log"
}
make -C "$build" install > "$build/install.log" 2>&1 || {
  tail -n 40 "$build/install.log" >&2
  loom_die "make install failed; the whole log is $build/install.log"
}

# Strip what was installed (real files only, not the symlinks to them).
find "$prefix/lib" "$prefix/bin" -type f \( -name '*.so*' -o -perm -u+x \) ! -name '*.la' \
  -exec strip --strip-unneeded {} + 2>/dev/null || true

log "built in $(loom_duration "$SECONDS"); $(du -sh "$prefix" | cut -f1) in $prefix"
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$prefix/bin/ucx_info" -v
echo "transports ucx_info -d lists here:"
"$prefix/bin/ucx_info" -d | grep Transport | sort -u
echo "the library loom opens and UCX's CUDA modules, with the libraries they need:"
ls -l "$prefix/lib/libucp.so.0"
for f in "$prefix"/lib/ucx/*cuda*.so; do
  [[ -e "$f" ]] || continue
  printf '%s: %s\n' "$f" "$(readelf -d "$f" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
done
ls "$prefix"/lib/ucx/libuct_cuda*.so >/dev/null 2>&1 || loom_die "no libuct_cuda module in $prefix/lib/ucx"
