#!/usr/bin/env bash
# One device call for the tree kernels: GPU suite (with compute-sanitizer), then the benchmark.
# Usage on a GPU host: bash scripts/gpu_tree.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/kdtree_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -m gpu tests/test_tree_gpu.py tests/test_compile.py -x 2>&1 | tee "$out/gpu_tests.log" | tail -25
python3 -m kdtree.cli bench tree --out results/tree_bench_h200 2>&1 | grep -v "bench tree:" | tee "$out/bench.log"
cp results/tree_bench_h200.* "$out/" 2>/dev/null
