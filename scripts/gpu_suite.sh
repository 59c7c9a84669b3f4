#!/usr/bin/env bash
# The GPU suite in one call on a GPU host: every GPU test (compute-sanitizer runs included),
# the attention tests again with every fused call on an opt-in kernel (EXTRA_IMPL, default
# tma; none skips it), then the tree benchmark (TREE_BENCH=0 skips it).
# Usage: [SUITE_SKIP=regex] bash scripts/gpu_suite.sh [OUT_DIR]; logs and tables land in OUT_DIR.
# SUITE_SKIP: GPU tests whose node ids match this extended regex are deselected (e.g. "tma" leaves
# out a kernel that has not run on a GPU yet); the log's first line says so and how many. (Not
# pytest -k: its keywords include every module global, so "not tma" deselected nearly all.)
set -uo pipefail
out=${1:-${OUT:-/tmp/kdtree_out}}
mkdir -p "$out"
. "$(dirname "$0")/device_env.sh"   # the workbook and executor tests import the notebook stack
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
skip=()
if [ -n "${SUITE_SKIP:-}" ]; then
    mapfile -t ids < <(python3 -m pytest --collect-only -q -m gpu tests 2>/dev/null | grep -E "::" | grep -E "$SUITE_SKIP")
    for id in "${ids[@]}"; do skip+=(--deselect "$id"); done
fi
{ [ -z "${SUITE_SKIP:-}" ] || echo "GPU tests matching /$SUITE_SKIP/ deselected: ${#ids[@]}"
  timeout 400 python3 -m pytest -q -m gpu "${skip[@]}" tests 2>&1; } | tee "$out/gpu_tests.log" \
    | grep -vE "Warning|warn|^  " | tail -12
extra=${EXTRA_IMPL:-tma}   # EXTRA_IMPL=none skips this pass
if [ "$extra" != none ]; then
    KDTREE_FUSED_IMPL=$extra timeout 200 python3 -m pytest -q -m gpu -k "not sanitizer" tests/test_attention.py \
        2>&1 | tee "$out/gpu_tests_$extra.log" | tail -4
fi
if [ "${TREE_BENCH:-1}" != 0 ]; then
    timeout 200 python3 -m kdtree.cli bench tree --out results/tree_bench_h200 2>&1 | grep -v "bench tree:" | tee "$out/bench_tree.log"
    cp results/tree_bench_h200.* "$out/" 2>/dev/null
fi
