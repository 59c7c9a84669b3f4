#!/usr/bin/env bash
# The engine's GPU measurements in one call on a GPU host: the engine's GPU tests (bf16 divergence
# report, graph capture), then engine_bench.py per preset in $PRESETS (default Kimi K2's
# attention shapes on one GPU; add kimi_k2_tp8 for a TP8 head slice). Usage:
# [PRESETS="kimi_k2_attn kimi_k2_tp8"] bash scripts/gpu_engine.sh [OUT_DIR]; ~6 min per preset
# on an H200 (bf16 references may take up to --max-rounds 16 rounds).
set -uo pipefail
out=${1:-${OUT:-/tmp/kdtree_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout 200 python3 -m pytest -q -s -m gpu tests/test_engine_gpu.py 2>&1 | tee "$out/engine_gpu_tests.log" \
    | grep -E "passed|failed|diverged|self-consistent|^FAILED"
for preset in ${PRESETS:-kimi_k2_attn}; do
    timeout 380 python3 scripts/engine_bench.py --out "$out/engine_$preset" --preset "$preset" --new 128 \
        --budgets 1,16,32,64,128,256,512 --breakdown-budgets 64,256 --accuracies paper --steps 10 \
        > "$out/engine_$preset.log" 2>&1
    echo "$preset: rc=$?"; tail -25 "$out/engine_$preset.log"
done
