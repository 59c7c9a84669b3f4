#!/usr/bin/env bash
# Where the fused verify kernels' warps wait: Nsight Compute's warp-state sampling (WarpStateStats,
# SourceCounters) of one call per kernel at one shape, ranked per opcode, per SASS line and per
# stall reason (scripts/ncu_rank.py). One ncu process per kernel, so each report holds one kernel.
#   SHAPE=1,257,64,4096  IMPLS="tma_seq tma"  OUT=/tmp/ncu_stalls  bash scripts/ncu_attention_stalls.sh
# An entry of IMPLS is an impl (its rows_m kernel) or impl:layout (rn72:rows_n).
# Writes $OUT/<impl>_source.csv, <impl>_raw.csv and stalls.txt (the ranking).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/ncu_stalls}; SHAPE=${SHAPE:-1,257,64,4096}; IMPLS=${IMPLS:-"tma_seq tma"}
mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for entry in $IMPLS; do
  impl=${entry%%:*}; kern=$entry
  [[ $entry == *:* ]] || kern="$impl:rows_m"
  rep="$OUT/$impl"
  timeout 120 "$NCU" --clock-control none --profile-from-start off -k regex:verify_fused \
      --section WarpStateStats --section SourceCounters --section SpeedOfLight \
      --metrics regex:smsp__pcsamp_warps_issue_stalled_.* -f -o "$rep" \
      python3 scripts/attention_dev.py --profile "$SHAPE" --kernels "$kern" > "$rep.log" 2>&1
  echo "ncu $impl at $SHAPE: rc $?, $(grep -c "==PROF==" "$rep.log") profiler lines"
  "$NCU" --import "$rep.ncu-rep" --page source --csv --print-source sass > "${rep}_source.csv" 2>&1
  "$NCU" --import "$rep.ncu-rep" --page raw --csv > "${rep}_raw.csv" 2>&1
  { echo "== $impl at B,N,H,P = $SHAPE"; python3 scripts/ncu_rank.py "${rep}_source.csv" --raw "${rep}_raw.csv" --top 30; } \
      >> "$OUT/stalls.txt" 2>&1
  rm -f "$rep.ncu-rep"
done
grep -E "^==|samples per opcode|samples;" "$OUT/stalls.txt"
