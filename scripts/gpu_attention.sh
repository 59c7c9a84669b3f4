#!/bin/bash
# verify_attention on a GPU in one call: kernel self-check, GPU tests, benchmark, compute-sanitizer.
# Logs and the benchmark table go under $OUT (default /tmp/gpu_attention). If the self-check of
# the default fused kernel fails, the rest runs with the mma.sync kernel (KDTREE_FUSED_IMPL=mma).
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_attention}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$OUT/smi.txt"
if timeout 100 python3 tests/sanitize_attention.py > "$OUT/selfcheck.log" 2>&1; then
  echo "selfcheck ok"
else
  echo "selfcheck FAILED: falling back to the mma.sync kernel"; export KDTREE_FUSED_IMPL=mma
fi
cat "$OUT/selfcheck.log" | tail -30
timeout 180 python3 -m pytest -q -m gpu -k "not sanitizer" tests/test_attention.py 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
timeout 240 python3 -m kdtree.bench.attention_bench --out "$OUT/verify_attention_h200" 2>&1 | tee "$OUT/bench.log"
timeout 150 python3 -m pytest -q -m gpu -k sanitizer -s tests/test_attention.py 2>&1 | grep -E "SUMMARY|passed|failed|Error|error|FAIL" | tee "$OUT/sanitizer.log"
