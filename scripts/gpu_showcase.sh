#!/usr/bin/env bash
# The committed H200 showcase: the default sweep twice, back to back in one device call (the
# second run measures rerun agreement), the GPU test suite, and `kdtree compare` of the two.
# Reports are rendered afterwards in the checkout (`kdtree report <run-id> --publish --png`): no
# GPU needed for that. The runner passes the commit it copied (a copied checkout's .git may be
# stale):
#   KDTREE_GIT_SHA=<sha> [KDTREE_GIT_DIRTY=0|1] [RUN_ID=h200-YYYYMMDD] [RUNS="ids"] [CALL_LIMIT=s] \
#       [SWEEP_LIMIT=s] [SUITE=1 | SUITE_LOG=path] bash scripts/gpu_showcase.sh [OUT_DIR]
# RUNS (default: RUN_ID and RUN_ID-rerun) run in order; the first gets at most SWEEP_LIMIT
# seconds, the next what is left of CALL_LIMIT (less a reserve for the suite, the compare and the
# archive). A run cut off keeps its finished points, and naming it in RUNS in the next call
# resumes it (its folder is unpacked from scratch/<id>.tgz when the machine no longer has it);
# SUITE=1 then runs the GPU suite and puts its log in every run folder it finds; SUITE_LOG names
# the log of a suite run earlier on the same commit (the previous call), put there instead.
# OUT_DIR gets the logs and runs.tgz (the run folders); `tar xzf runs.tgz` in the checkout.
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
runs=${RUNS:-"$rid $rid-rerun"}
first=${runs%% *}
for r in $runs; do
    [ -d "parameterized_runs/$r" ] || [ ! -f "scratch/$r.tgz" ] || tar xzf "scratch/$r.tgz"
    limit=$(( $(left) - reserve ))
    [ "$r" = "$first" ] && [ "$limit" -gt "${SWEEP_LIMIT:-300}" ] && limit=${SWEEP_LIMIT:-300}
    if [ "$limit" -lt 30 ]; then echo "sweep $r: not started ($limit s left)"; continue; fi
    start=$(date +%s)
    # SIGINT at the limit: finished points are kept, and `--run-id` resumes the rest.
    timeout -s INT -k 20 "$limit" python3 -m kdtree.cli sweep parameterized_runs/default.yaml \
        --run-id "$r" >> "$out/sweep-$r.log" 2>&1
    echo "sweep $r: rc=$? in $(( $(date +%s) - start )) s (limit $limit s)"
    grep -vE "distributed\.|IPKernelApp|without encryption" "$out/sweep-$r.log" | tail -3
done
log=${SUITE_LOG:-}
if [ "${SUITE:-0}" = 1 ]; then
    EXTRA_IMPL=none TREE_BENCH=0 timeout $(( $(left) - 20 )) bash scripts/gpu_suite.sh "$out/suite"
    log=$out/suite/gpu_tests.log
fi
if [ -n "$log" ]; then
    for r in "$rid" "$rid-rerun"; do
        [ ! -d "parameterized_runs/$r" ] || cp "$log" "parameterized_runs/$r/gpu_tests.log"
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
tar czf "$out/runs.tgz" $(for r in "$rid" "$rid-rerun"; do [ ! -d "parameterized_runs/$r" ] || echo "parameterized_runs/$r"; done)
ls -la "$out"
