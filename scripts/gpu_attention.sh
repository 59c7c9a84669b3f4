#!/bin/bash
# verify_attention on a GPU in one call: GPU tests, benchmark, compute-sanitizer runs.
# Logs and the benchmark table go under $OUT (default /tmp/gpu_attention).
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_attention}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$OUT/smi.txt"
timeout 200 python3 -m pytest -q -m gpu -k "not sanitizer" tests/test_attention.py 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
timeout 260 python3 -m kdtree.bench.attention_bench --out "$OUT/verify_attention_h200" 2>&1 | tee "$OUT/bench.log"
timeout 200 python3 -m pytest -q -m gpu -k sanitizer -s tests/test_attention.py 2>&1 | grep -E "SUMMARY|passed|failed|Error|error|ok$|FAIL" | tee "$OUT/sanitizer.log"
