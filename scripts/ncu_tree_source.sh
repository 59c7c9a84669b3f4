#!/usr/bin/env bash
# Per-instruction stall sampling of build_tree (batch 64, budget 512) on a GPU host.
# Writes $OUT/build_tree_source.csv (SASS with sampled stalls) and prints the hottest lines.
set -uo pipefail
out=${1:-${OUT:-/tmp/kdtree_out}}; mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ncu --clock-control none -k build_tree -c 1 --section SourceCounters --section WarpStateStats \
    --section InstructionStats -f -o "$out/build_tree" python3 scripts/profile_tree.py --ncu > /dev/null 2>&1
ncu --import "$out/build_tree.ncu-rep" --page source --csv --print-source sass > "$out/build_tree_source.csv" 2>&1
python3 scripts/ncu_rank.py "$out/build_tree_source.csv"
