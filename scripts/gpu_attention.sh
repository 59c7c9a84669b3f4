#!/bin/bash
# verify_attention on a GPU in one call: build and self-check every fused kernel, time the fused
# kernels at the development shapes (scripts/attention_dev.py), compute-sanitizer (memcheck,
# racecheck, synccheck) per kernel, the GPU tests; a short table last. Logs under $OUT (default
# /tmp/gpu_attention): selfcheck.log, dev.log, dev.csv, sanitizer.log, gpu_tests.log.
#   SANITIZE="tma_seq rows_n wgmma mma"  kernels to sanitize, in order (default: these; also tma)
#   BUDGET=420                   seconds; a step that would start past it is skipped (and says so)
#   DEV_ARGS=--splits            extra arguments of attention_dev.py
#   TESTS_K="not sanitizer"      pytest -k expression of the GPU tests
#   NCU_SHAPE=64,9,8,16384       also Nsight Compute on one fused call per kernel at that B,N,H,P
#                                (several: "B,N,H,P;B,N,H,P"), into ncu.txt
#   NCU_KERNELS=wgmma:rows_m,wgmma:rows_n   impl:layout pairs profiled (default: wgmma, both layouts)
#   NCU_METRICS=dram__bytes_read.sum,...    only these metrics (default: the full section set)
#   TABLE=1                      also the benchmark table (scripts/verify_table.py) into table.*
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_attention}
BUDGET=${BUDGET:-420}
mkdir -p "$OUT"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
have() {  # have SECONDS_NEEDED NAME: is there time for this step?
  if [ $((SECONDS + $1)) -gt "$BUDGET" ]; then echo "SKIPPED $2 (budget ${BUDGET}s, at ${SECONDS}s)"; return 1; fi
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$OUT/dev.log"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/dev.log"
if timeout 150 python3 tests/sanitize_attention.py > "$OUT/selfcheck.log" 2>&1; then
  echo "selfcheck ok ($(grep -c ' ok$' "$OUT/selfcheck.log") runs) at ${SECONDS}s"
else
  echo "selfcheck FAILED at ${SECONDS}s:"; grep -E "FAIL|Error|error" "$OUT/selfcheck.log" | head -20
fi
have 60 timing && timeout $((BUDGET - SECONDS - 30)) python3 scripts/attention_dev.py --out "$OUT/dev.csv" \
  $DEV_ARGS >> "$OUT/dev.log" 2>&1
echo "timing done at ${SECONDS}s (rc $?)"
: > "$OUT/sanitizer.log"
for kernel in ${SANITIZE:-tma_seq rows_n wgmma mma}; do
  for tool in memcheck racecheck synccheck; do
    have 40 "$tool $kernel" || continue
    echo "== $tool $kernel" >> "$OUT/sanitizer.log"
    timeout 150 "$SAN" --tool=$tool python3 tests/sanitize_attention.py $kernel >> "$OUT/sanitizer.log" 2>&1
    echo "$tool $kernel (rc $?): $(grep -E 'SUMMARY' "$OUT/sanitizer.log" | tail -1) at ${SECONDS}s"
  done
done
grep -c FAIL "$OUT/sanitizer.log" | sed 's/^/sanitizer FAIL lines: /'
if have 60 "GPU tests"; then
  timeout $((BUDGET - SECONDS)) python3 -m pytest -q -m gpu -k "${TESTS_K:-not sanitizer}" tests/test_attention.py \
    > "$OUT/gpu_tests.log" 2>&1
  grep -E "FAILED|passed|failed" "$OUT/gpu_tests.log" | tail -15
fi
if [ -n "$NCU_SHAPE" ] && have 90 "ncu"; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  if [ -n "$NCU_METRICS" ]; then NCU_WHAT=(--metrics "$NCU_METRICS"); else NCU_WHAT=(--set full); fi
  timeout $((BUDGET - SECONDS)) "$NCU" --clock-control none --profile-from-start off "${NCU_WHAT[@]}" \
    python3 scripts/attention_dev.py --profile "$NCU_SHAPE" --kernels "${NCU_KERNELS:-wgmma:rows_m,wgmma:rows_n}" \
    > "$OUT/ncu.txt" 2>&1
  echo "ncu (rc $?): $(grep -cE '^\s+verify_fused' "$OUT/ncu.txt") kernels profiled at ${SECONDS}s"
fi
if [ -n "$TABLE" ] && have 120 "table"; then
  timeout $((BUDGET - SECONDS)) python3 scripts/verify_table.py --out "$OUT/table" --budget $((BUDGET - SECONDS - 30)) \
    > "$OUT/table.log" 2>&1
  echo "table (rc $?) at ${SECONDS}s: $(tail -1 "$OUT/table.log")"
fi
sed -n '/^HBM /,$p' "$OUT/dev.log"
grep -E "WRONG|Error" "$OUT/dev.log" | head
