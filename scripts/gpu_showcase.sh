#!/usr/bin/env bash
# The committed H200 showcase: the default sweep twice in one device call, as twins (`kdtree sweep
# --twin`: every point runs in RUN_ID, then at once in RUN_ID-twin), the GPU test suite's log, and
# `kdtree compare` of the two runs. Reports are rendered afterwards in the checkout (`kdtree report
# <run-id> --publish --png`): no GPU needed for that. The runner passes the commit it copied (a
# copied checkout's .git may be stale):
#   KDTREE_GIT_SHA=<sha> [KDTREE_GIT_DIRTY=0|1] [RUN_ID=h200-YYYYMMDD] [CALL_LIMIT=s] \
#       [SUITE=1 | SUITE_LOG=path] bash scripts/gpu_showcase.sh [OUT_DIR]
# The sweep gets what is left of CALL_LIMIT (less a reserve for the suite, the compare and the
# archive). A sweep cut off keeps its finished points, and the same RUN_ID in the next call
# resumes both runs (unpacked from scratch/<id>.tgz when the machine no longer has them);
# SUITE=1 then runs the GPU suite and puts its log in both run folders; SUITE_LOG names the log of
# a suite run earlier on the same commit, put there instead.
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
twin=$rid-twin
for r in "$rid" "$twin"; do [ -d "parameterized_runs/$r" ] || [ ! -f "scratch/$r.tgz" ] || tar xzf "scratch/$r.tgz"; done
limit=$(( $(left) - reserve ))
if [ "$limit" -lt 30 ]; then echo "sweep $rid: not started ($limit s left)"; else
    start=$(date +%s)
    # SIGINT at the limit: finished points are kept, and the same --run-id resumes the rest.
    timeout -s INT -k 20 "$limit" python3 -m kdtree.cli sweep parameterized_runs/default.yaml \
        --run-id "$rid" --twin >> "$out/sweep-$rid.log" 2>&1
    echo "sweep $rid and $twin: rc=$? in $(( $(date +%s) - start )) s (limit $limit s)"
    grep -vE "distributed\.|IPKernelApp|without encryption" "$out/sweep-$rid.log" | tail -4
fi
log=${SUITE_LOG:-}
if [ "${SUITE:-0}" = 1 ]; then
    EXTRA_IMPL=none TREE_BENCH=0 timeout $(( $(left) - 20 )) bash scripts/gpu_suite.sh "$out/suite"
    log=$out/suite/gpu_tests.log
fi
if [ -n "$log" ]; then
    for r in "$rid" "$twin"; do
        [ ! -d "parameterized_runs/$r" ] || cp "$log" "parameterized_runs/$r/gpu_tests.log"
    done
fi
python3 - "$rid" "$twin" <<'PY' | tee "$out/points.txt"
import json, sys
for rid in sys.argv[1:]:
    try:
        m = json.load(open(f"parameterized_runs/{rid}/run.json"))
    except OSError:
        continue
    for pid, e in m["points"].items():
        print(f"{rid}  {e['status']:>11}  {e.get('seconds', '-'):>7}  {pid}  {(e.get('error') or '')[:150]}")
PY
python3 -m kdtree.cli compare "$rid" "$twin" 2>&1 | tee "$out/compare.txt" | head -20
tar czf "$out/runs.tgz" $(for r in "$rid" "$twin"; do [ ! -d "parameterized_runs/$r" ] || echo "parameterized_runs/$r"; done)
ls -la "$out"
