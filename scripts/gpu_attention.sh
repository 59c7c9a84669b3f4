#!/bin/bash
# verify_attention on a GPU in one call: kernel self-check, GPU tests, benchmark, compute-sanitizer.
# Logs and the benchmark table go under $OUT (default /tmp/gpu_attention).
# KDTREE_FUSED_IMPL=wgmma exercises the opt-in wgmma kernel too; if its self-check fails, the
# rest runs on the mma.sync kernel so the benchmark still produces a table.
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_attention}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$OUT/smi.txt"
if timeout 100 python3 tests/sanitize_attention.py > "$OUT/selfcheck.log" 2>&1; then
  echo "selfcheck ok (fused kernel: ${KDTREE_FUSED_IMPL:-mma})"
elif [ "${KDTREE_FUSED_IMPL:-mma}" != mma ]; then
  echo "selfcheck FAILED with ${KDTREE_FUSED_IMPL}: falling back to the mma.sync kernel"; export KDTREE_FUSED_IMPL=mma
else
  echo "selfcheck FAILED"
fi
tail -30 "$OUT/selfcheck.log"
timeout 180 python3 -m pytest -q -m gpu -k "not sanitizer" tests/test_attention.py 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
timeout 240 python3 -m kdtree.bench.attention_bench --out "$OUT/verify_attention_h200" 2>&1 | tee "$OUT/bench.log"
timeout 150 python3 -m pytest -q -m gpu -k sanitizer -s tests/test_attention.py 2>&1 | grep -E "SUMMARY|passed|failed|Error|error|FAIL" | tee "$OUT/sanitizer.log"
