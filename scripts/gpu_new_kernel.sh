#!/bin/bash
# A new verify-attention kernel on an H200 in one device call (by default the v6 kernels, impl tma /
# tma_seq, cuda/verify_attention_tma.cu): its GPU tests (float64 reference on fresh random trees:
# padding nodes, N = 513, prefix 0, ragged prefixes, split counts, cascade), compute-sanitizer
# memcheck / racecheck / synccheck on the self-check's small cases, then the new kernels against the
# older ones by CUDA-graph replay with cold L2 at four shapes, each checked against float64 (first and
# last sequence) before it is timed; a short table last. Logs and the table's CSV under $OUT
# (default /tmp/gpu_new_kernel): gpu_tests.log, sanitizer.log, timing.csv, timing.log.
#   NEW="tma tma_seq"   the kernels under test (impl names; tests/sanitize_attention.py's names)
#   BASE="wgmma"   the kernels timed beside them (kept if a new one hangs)
#   TESTS_K="(-tma- or -tma_seq- or test_tma_) and not sanitizer"   pytest -k of the new kernels'
#                  GPU tests ("tma" alone would match every marked test through "pytestmark")
#   BUDGET=190     seconds; a step that would start past it is skipped (and says so)
#   TIMING_S=50    seconds of the budget kept for the timing (a sanitizer run is cut short for it)
#   SHAPES="1,33,64,4096;16,33,64,16384;1,257,64,4096;64,9,8,16384"   B,N,H,P of the timing
# Usage: bash scripts/gpu_new_kernel.sh   (the v6 kernels)
#        NEW=tma_seq BASE="wgmma tma" TESTS_K="tma_seq and not sanitizer" bash scripts/gpu_new_kernel.sh
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_new_kernel}
BUDGET=${BUDGET:-190}
NEW=${NEW:-"tma tma_seq"}
BASE=${BASE:-"wgmma"}
TESTS_K=${TESTS_K:-"(-tma- or -tma_seq- or test_tma_) and not sanitizer"}
mkdir -p "$OUT"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
have() {  # have SECONDS_NEEDED NAME: is there time for this step?
  if [ $((SECONDS + $1)) -gt "$BUDGET" ]; then echo "SKIPPED $2 (budget ${BUDGET}s, at ${SECONDS}s)"; return 1; fi
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/timing.log"
echo "commit ${KDTREE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}" | tee -a "$OUT/timing.log"

# 1. GPU tests of the new kernels (the sanitizer runs come next, one process per tool)
timeout 100 python3 -m pytest -q -m gpu -k "$TESTS_K" tests/test_attention.py > "$OUT/gpu_tests.log" 2>&1
tests_rc=$?
echo "gpu tests (rc $tests_rc) at ${SECONDS}s: $(grep -E 'passed|failed|skipped|error' "$OUT/gpu_tests.log" | tail -1)"
grep -E "^FAILED" "$OUT/gpu_tests.log" | head -10
IMPLS="$BASE $NEW"
if [ $tests_rc = 124 ]; then  # cut off: a new kernel may hang; keep the rest of the call for the others
  echo "gpu tests cut off at 100 s: sanitizers skipped, $NEW left out of the timing"; tail -3 "$OUT/gpu_tests.log"
  IMPLS=$BASE
elif grep -qiE "CUDA_ERROR|illegal|misaligned|unspecified launch failure" "$OUT/gpu_tests.log"; then
  echo "a CUDA fault in the tests (it would end the timing process): $NEW left out of the timing"
  grep -iE -m 3 "CUDA_ERROR|illegal|misaligned|unspecified launch failure" "$OUT/gpu_tests.log"
  IMPLS=$BASE
fi

# 2. compute-sanitizer, every new kernel per run (fused at splits auto / 1 / 3, and cascade); the
# last TIMING_S seconds of the budget stay for the timing
TIMING_S=${TIMING_S:-50}
: > "$OUT/sanitizer.log"
for tool in racecheck memcheck synccheck; do
  [ $tests_rc = 124 ] && break
  have $((TIMING_S + 30)) "$tool" || continue
  echo "== $tool $NEW" >> "$OUT/sanitizer.log"
  limit=$((BUDGET - TIMING_S - SECONDS)); [ $limit -gt 120 ] && limit=120
  # shellcheck disable=SC2086  # NEW: a list of names
  timeout $limit "$SAN" --tool=$tool python3 tests/sanitize_attention.py $NEW >> "$OUT/sanitizer.log" 2>&1
  echo "$tool (rc $?): $(grep -E 'SUMMARY' "$OUT/sanitizer.log" | tail -1); $(grep -c ' ok$' "$OUT/sanitizer.log") ok, $(grep -c 'FAIL' "$OUT/sanitizer.log") FAIL lines so far, at ${SECONDS}s"
done

# 3. timing: graph replay, cold L2, every kernel checked against float64 first
have 30 "timing" && SHAPES=${SHAPES:-"1,33,64,4096;16,33,64,16384;1,257,64,4096;64,9,8,16384"} IMPLS=$IMPLS \
  timeout $((BUDGET - SECONDS + 5)) python3 - "$OUT/timing.csv" >> "$OUT/timing.log" 2>&1 <<'EOF'
import csv, os, sys

import torch

sys.path.insert(0, "scripts")
from attention_dev import (ceilings, check_config, cost, input_sets, parse_shapes, references, run_config,
                           time_config)
from kdtree.attention import _num_sms, launch_plan

IMPLS = os.environ["IMPLS"].split()
sms, l2 = _num_sms(0), torch.cuda.get_device_properties(0).L2_cache_size
bw, rate = ceilings()
print(f"{torch.cuda.get_device_name(0)}: {sms} SMs, HBM {bw / 1e12:.2f} TB/s, dense bf16 {rate / 1e12:.0f} TFLOP/s "
      "(measured now); CUDA-graph replay, cold L2, median [p20, p80]", flush=True)
gen = torch.Generator().manual_seed(6)
rows = []
for B, N, H, P in parse_shapes(os.environ["SHAPES"]):
    tree, pl, sets = input_sets(B, N, H, P, gen, l2)
    out = (torch.empty(B, N, H, 512, dtype=torch.bfloat16, device="cuda"),
           torch.empty(B, N, H, dtype=torch.float32, device="cuda"))
    flops, nbytes = cost(B, N, H, P, tree)
    refs = references(tree, pl, *sets[0])
    for impl in IMPLS:
        plan = launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms, impl=impl)
        row = dict(B=B, N=N, H=H, P=P, impl=impl, splits=plan.splits, us=float("nan"), p20=float("nan"),
                   p80=float("nan"), tflops=float("nan"), frac_bf16=float("nan"), frac_hbm=float("nan"), check="")
        try:
            out[0].fill_(float("nan"))
            run_config("fused", tree, pl, *sets[0], out, impl=impl)
            worst, wrong = check_config(refs, out)
            row["check"] = wrong or f"ok rel={worst:.1e}"
            if not wrong:
                tm = time_config("fused", tree, pl, sets, out, impl=impl)
                t = tm.median_us * 1e-6
                row.update(us=tm.median_us, p20=tm.p20_us, p80=tm.p80_us, tflops=flops / t / 1e12,
                           frac_bf16=flops / t / rate, frac_hbm=nbytes / t / bw)
        except Exception as e:  # a kernel that fails to launch must not hide the others' figures
            row["check"] = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            torch.cuda.synchronize()
        rows.append(row)
        print(f"B={B} N={N} H={H} P={P} {impl}: {row['check']} {row['us']:.1f} us", flush=True)
    sets.clear()
    torch.cuda.empty_cache()
with open(sys.argv[1], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"\n{'B':>3} {'N':>4} {'H':>3} {'P':>6} {'impl':12} {'spl':>3} {'us':>8} {'p20-p80':>15} {'TFLOP/s':>8} "
      f"{'bf16':>5} {'hbm':>5}  check")
for r in rows:
    print(f"{r['B']:3d} {r['N']:4d} {r['H']:3d} {r['P']:6d} {r['impl']:12} {r['splits']:3d} {r['us']:8.1f} "
          f"{r['p20']:7.1f}-{r['p80']:<7.1f} {r['tflops']:8.1f} {r['frac_bf16']:5.2f} {r['frac_hbm']:5.2f}  "
          f"{r['check']}")
EOF
echo "timing (rc $?) at ${SECONDS}s"
sed -n '/^ *B *N *H/,$p' "$OUT/timing.log"
grep -E "WRONG|ERROR|Error" "$OUT/timing.log" | head -5
