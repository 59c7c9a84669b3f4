#!/usr/bin/env bash
# The committed H200 showcase: the default sweep twice, back to back in one device call (the
# second run measures rerun agreement), the GPU test suite, and `kdtree compare` of the two.
# Reports are rendered afterwards in the checkout (`kdtree report <run-id> --publish --png`): no
# GPU needed for that. The runner passes the commit it copied (a copied checkout's .git may be
# stale):
#   KDTREE_GIT_SHA=<sha> [KDTREE_GIT_DIRTY=0|1] [RUN_ID=h200-YYYYMMDD] [CALL_LIMIT=s] \
#       [SWEEP_LIMIT=s] [SUITE=1] bash scripts/gpu_showcase.sh [OUT_DIR]
# The first run gets at most SWEEP_LIMIT seconds, the rerun what is left of CALL_LIMIT (less a
# reserve for the suite, the compare and the archive). A run cut off keeps its finished points:
# the same command in the next call (same RUN_ID, on the same machine) resumes both runs where
# they stopped, then, with SUITE=1, runs the GPU suite and puts its log in both run folders.
# OUT_DIR gets the logs and runs.tgz (both run folders); `tar xzf runs.tgz` in the checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kdtree_showcase}}
mkdir -p "$out"
. scripts/device_env.sh
rid=${RUN_ID:-h200-$(date -u +%Y%m%d)}
t0=$(date +%s)
left() { echo $(( ${CALL_LIMIT:-585} - ($(date +%s) - t0) )); }
reserve=$(( ${SUITE:-0} == 1 ? 230 : 30 ))
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
for r in "$rid" "$rid-rerun"; do
    limit=$(( $(left) - reserve ))
    [ "$r" = "$rid" ] && [ "$limit" -gt "${SWEEP_LIMIT:-300}" ] && limit=${SWEEP_LIMIT:-300}
    if [ "$limit" -lt 30 ]; then echo "sweep $r: not started ($limit s left)"; continue; fi
    start=$(date +%s)
    # SIGINT at the limit: finished points are kept, and `--run-id` resumes the rest.
    timeout -s INT -k 20 "$limit" python3 -m kdtree.cli sweep parameterized_runs/default.yaml \
        --run-id "$r" >> "$out/sweep-$r.log" 2>&1
    echo "sweep $r: rc=$? in $(( $(date +%s) - start )) s (limit $limit s)"
    grep -vE "distributed\.|IPKernelApp|without encryption" "$out/sweep-$r.log" | tail -3
done
if [ "${SUITE:-0}" = 1 ]; then
    EXTRA_IMPL=none TREE_BENCH=0 timeout $(( $(left) - 20 )) bash scripts/gpu_suite.sh "$out/suite"
    for r in "$rid" "$rid-rerun"; do
        [ -d "parameterized_runs/$r" ] && cp "$out/suite/gpu_tests.log" "parameterized_runs/$r/gpu_tests.log"
    done
fi
python3 - "$rid" "$rid-rerun" <<'PY' | tee "$out/points.txt"
import json, sys
for rid in sys.argv[1:]:
    try:
        m = json.load(open(f"parameterized_runs/{rid}/run.json"))
    except OSError:
        continue
    for pid, e in m["points"].items():
        print(f"{rid}  {e['status']:>11}  {e.get('seconds', '-'):>7}  {pid}  {(e.get('error') or '')[:150]}")
PY
python3 -m kdtree.cli compare "$rid" "$rid-rerun" 2>&1 | tee "$out/compare.txt" | head -20
tar czf "$out/runs.tgz" "parameterized_runs/$rid" "parameterized_runs/$rid-rerun" 2>/dev/null
ls -la "$out"
