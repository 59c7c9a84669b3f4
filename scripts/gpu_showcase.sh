#!/usr/bin/env bash
# The committed H200 showcase in one device call: the default sweep twice, back to back (the
# second run measures rerun agreement), and `kdtree compare` of the two. Reports are rendered
# afterwards in the checkout (`kdtree report <run-id> --publish --png`): no GPU needed for that.
# The runner passes the commit it copied (a copied checkout's .git may be stale):
#   KDTREE_GIT_SHA=<sha> [KDTREE_GIT_DIRTY=0|1] [RUN_ID=h200-YYYYMMDD] [SWEEP_LIMIT=s] \
#       bash scripts/gpu_showcase.sh [OUT_DIR]
# OUT_DIR gets the logs and runs.tgz (both run folders); `tar xzf runs.tgz` in the checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kdtree_showcase}}
mkdir -p "$out"
. scripts/device_env.sh
rid=${RUN_ID:-h200-$(date -u +%Y%m%d)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
for r in "$rid" "$rid-rerun"; do
    start=$(date +%s)
    # SIGINT at the limit: finished points are kept, and `--run-id` resumes the rest.
    timeout -s INT -k 20 "${SWEEP_LIMIT:-285}" python3 -m kdtree.cli sweep parameterized_runs/default.yaml \
        --run-id "$r" > "$out/sweep-$r.log" 2>&1
    echo "sweep $r: rc=$? in $(( $(date +%s) - start )) s"; tail -4 "$out/sweep-$r.log"
done
python3 -m kdtree.cli compare "$rid" "$rid-rerun" 2>&1 | tee "$out/compare.txt" | head -20
tar czf "$out/runs.tgz" "parameterized_runs/$rid" "parameterized_runs/$rid-rerun" 2>/dev/null
ls -la "$out"
