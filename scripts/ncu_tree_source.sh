#!/usr/bin/env bash
# Per-instruction stall sampling of build_tree (batch 64, budget 512) on a GPU host.
# Writes $OUT/build_tree_source.csv (SASS with sampled stalls) and prints the hottest lines.
set -uo pipefail
out=${1:-${OUT:-/tmp/kdtree_out}}; mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ncu --clock-control none -k build_tree -c 1 --section SourceCounters --section WarpStateStats \
    --section InstructionStats -f -o "$out/build_tree" python3 scripts/profile_tree.py --ncu > /dev/null 2>&1
ncu --import "$out/build_tree.ncu-rep" --page source --csv --print-source sass > "$out/build_tree_source.csv" 2>&1
python3 - "$out/build_tree_source.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if any("Source" == c for c in r))
cols = rows[head]
src = cols.index("Source")
samp = next(i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All"))
body = [r for r in rows[head + 1:] if len(r) == len(cols)]
total = sum(float(r[samp] or 0) for r in body)
print(f"{len(body)} SASS lines, {total:.0f} stall samples; hottest 40:")
for r in sorted(body, key=lambda r: -float(r[samp] or 0))[:40]:
    print(f"{float(r[samp] or 0) / total:6.1%}  {r[0]:>6}  {r[src][:90]}")
PY
