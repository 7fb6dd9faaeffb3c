#!/usr/bin/env bash
# PyTorch's NCCL backend running on loom: tests/gpu/torch_smoke.py under
# torch.distributed.run, one process per GPU (2), with loom's libnccl.so.2 preloaded in
# front of the NCCL PyTorch ships. Passes when every collective gave the exact values and
# loom's log shows it was loom that ran them.
#
#   tests/gpu/torch_smoke.sh LIBNCCL [torch_smoke.py options: --bench, --as-hosts]
#
# Exits 77 (skipped) without PyTorch, CUDA or two GPUs (one with --as-hosts: both processes
# claim hosts of their own and share it; start CUDA MPS first, or their kernels take
# turns). LIBNCCL=none runs PyTorch's own NCCL instead (to compare --bench figures).
set -u
lib=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
gpus=2
for a in "$@"; do [ "$a" = --as-hosts ] && gpus=1; done
if ! "$python" -c "import torch, torch.distributed as d; assert d.is_nccl_available() and torch.cuda.device_count() >= $gpus" 2>/dev/null; then
  echo "SKIP: needs PyTorch with NCCL support and $gpus GPU(s)"
  exit 77
fi
export NCCL_NVLS_ENABLE=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if [ "$lib" = none ]; then
  "$python" -m torch.distributed.run --standalone --nproc_per_node 2 "$here/torch_smoke.py" "$@" > "$out" 2>&1
else
  LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=${LOOM_DEBUG_SUBSYS:-INIT} LD_PRELOAD="$lib" \
    "$python" -m torch.distributed.run --standalone --nproc_per_node 2 "$here/torch_smoke.py" "$@" > "$out" 2>&1
fi
rc=$?
grep -E "failure|bench|Error|error" "$out" | grep -v "loom INFO" | head -40
if [ $rc -ne 0 ]; then
  echo "FAIL: torch.distributed.run exited with $rc"; tail -40 "$out"; exit 1
fi
if [ "$lib" != none ] && ! grep -q "loom INFO" "$out"; then
  echo "FAIL: no loom log lines: PyTorch did not run on $lib"; exit 1
fi
if [ "$lib" != none ]; then
  echo "loom log lines: $(grep -c 'loom INFO' "$out"); calls on registered inputs:" \
    "$(grep -c 'registered inputs' "$out"); registrations without effect:" \
    "$(grep -c 'without effect' "$out"); peers' allocations mapped: $(grep -c 'mapped rank' "$out")"
  grep -m3 "without effect" "$out"
fi
echo PASS
