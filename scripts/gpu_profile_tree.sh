#!/usr/bin/env bash
# Profile the tree build on a GPU host: host overhead, SM clock, ncu stall reasons.
set -uo pipefail
out=${1:-${OUT:-/tmp/kdtree_out}}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 scripts/profile_tree.py 2>&1 | tee "$out/profile.txt" | head -60
ncu --clock-control none -k build_tree -c 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section InstructionStats --section SourceCounters \
    python3 scripts/profile_tree.py --ncu 2>&1 | tee "$out/ncu.txt" | grep -vE "^==PROF==" | tail -80
