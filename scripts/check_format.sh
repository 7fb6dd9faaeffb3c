#!/usr/bin/env bash
# Checks that every C++ and CUDA source follows .clang-format (the formatter's output equals
# the file). CI runs it before the tests; run it before a commit, or with --fix to format.
#
#   scripts/check_format.sh          list the files that differ, exit 1 if any
#   scripts/check_format.sh --fix    format them in place
#
# Formatting differs between clang-format versions, so the check holds the version that
# Debian 12 ships (14); another version formats nothing and says so, unless
# LOOM_FORMAT_ANY_VERSION=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$LOOM_ROOT"

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) loom_die "usage: scripts/check_format.sh [--fix]" ;;
esac

want=14
tool=""
for c in "clang-format-$want" clang-format; do
  if command -v "$c" >/dev/null 2>&1; then tool="$c"; break; fi
done
if [[ -z "$tool" ]]; then
  loom_setup clang-format
  command -v clang-format >/dev/null 2>&1 || loom_die "clang-format is not installed (apt-get install clang-format)"
  tool=clang-format
fi
version="$("$tool" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')"
if [[ "$version" != "$want" && "${LOOM_FORMAT_ANY_VERSION:-0}" != 1 ]]; then
  loom_log "format: $tool is version ${version:-unknown}, not $want; formatting not checked (versions format differently; LOOM_FORMAT_ANY_VERSION=1 checks anyway)"
  exit 0
fi

mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if ((fix)); then
  "$tool" -i "${files[@]}"
  loom_log "format: ${#files[@]} files formatted with $tool $version"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$tool" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]} > 0)); then
  loom_log "format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($tool $version):"
  printf '  %s\n' "${bad[@]}" >&2
  loom_log "format: scripts/check_format.sh --fix formats them"
  exit 1
fi
loom_log "format: ${#files[@]} files follow .clang-format ($tool $version)"
