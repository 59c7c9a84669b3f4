#!/usr/bin/env bash
# Is host dispatch slower right after Nsight Compute? In the twin pair h200-20261201-5 the run's
# 03 notebook (eager engine steps, host-bound) ran ~30% slower than its twin's, and it came right
# after the two 04 notebooks (kdtree profile under ncu); the twin's 03 did not. This measures, each
# in a fresh process as a sweep's notebooks are: the eager host floor of kdtree's ops
# (ceilings.eager_floors) and of a bare torch op, twice before `kdtree profile`, then right after
# it, 30 s and 60 s later. A slowdown that fades says: order the counters notebook last.
#   bash scripts/dispatch_after_ncu.sh [OUT_DIR]     (GPU host with ncu; about 90 s)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/dispatch_after_ncu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
probe() {  # probe LABEL: one fresh process, one line
    python3 - "$1" <<'PY' | tee -a "$out/dispatch.txt"
import sys, time

import torch

from kdtree.bench.ceilings import eager_floors
from kdtree.bench.timing import time_events

x = torch.zeros(1, device="cuda")
bare = time_events([lambda: x.add_(1)], reps=500, warmup=50).median_us
floors = eager_floors()
print(f"{sys.argv[1]:>12} {time.strftime('%H:%M:%S')}  torch add_ {bare:6.1f} us  "
      + "  ".join(f"{k} {v:6.1f}" for k, v in floors.items()), flush=True)
PY
}
: > "$out/dispatch.txt"
probe before-1
probe before-2
timeout 120 python3 -m kdtree.cli profile --full --out "$out/profile" > "$out/profile.log" 2>&1
echo "kdtree profile rc $?" | tee -a "$out/dispatch.txt"
probe after-0s
sleep 30
probe after-30s
sleep 30
probe after-60s
