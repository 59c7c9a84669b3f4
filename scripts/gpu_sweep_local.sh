#!/usr/bin/env bash
# The default sweep on a GPU host through the local executor (one dask worker per visible GPU,
# pinned with CUDA_VISIBLE_DEVICES), with its report, in one call. For an offline host: the
# notebook stack and dask come from the wheels in .whl (kdtree wheelhouse, or pip download).
# Usage: KDTREE_GIT_SHA=<sha> [SWEEP_LIMIT=seconds] bash scripts/gpu_sweep_local.sh [OUT_DIR]
# OUT_DIR gets the logs and <run-id>.tgz (parameterized_runs/<run-id>/ and reports/<run-id>/);
# unpack it in the checkout with `tar xzf <run-id>.tgz`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kdtree_sweep}}
mkdir -p "$out"
. scripts/device_env.sh
rid=${RUN_ID:-h200-local-$(date -u +%Y%m%d)}

nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
python3 -c "import dask, distributed, papermill; print('dask', dask.__version__, 'papermill', papermill.__version__)"

# SIGINT at the limit: the sweep records its finished points, marks the rest and stops cleanly.
timeout -s INT -k 20 "${SWEEP_LIMIT:-200}" python3 -m kdtree.cli sweep parameterized_runs/default.yaml --executor local \
    --run-id "$rid" --report 2>&1 | grep -vE "distributed\.|IPKernelApp|without encryption" | tee "$out/sweep.log"
rc=$?
if [ ! -f "reports/$rid/index.html" ] && [ -f "parameterized_runs/$rid/run.json" ]; then
    echo "sweep ended with $rc before its report: rendering what finished"
    timeout 60 python3 -m kdtree.cli report "$rid" 2>&1 | tail -3 | tee -a "$out/sweep.log"
fi
python3 - "$rid" <<'EOF' | tee "$out/points.txt"
import json, sys
m = json.load(open(f"parameterized_runs/{sys.argv[1]}/run.json"))
for pid, e in m["points"].items():
    print(f"{e['status']:>11}  {e.get('seconds', '-'):>7}  gpu={e.get('gpu')}  {pid}  {(e.get('error') or '')[:120]}")
EOF
tar czf "$out/$rid.tgz" "parameterized_runs/$rid" "reports/$rid" reports/index.html
ls -la "$out"
