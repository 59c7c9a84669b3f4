#!/usr/bin/env bash
# How steady is host dispatch from one process to the next, and does pinning a process to one CPU
# steady it? The workbook's eager points (CUDA events around one call through kdtree's Python path)
# moved up to 1.5x between the twin runs of one call, a whole notebook at a time. Each probe is a
# fresh process, as a sweep's notebooks are; it measures kdtree's eager floors (ceilings.eager_floors)
# and a bare torch op three times in the process, and prints the CPUs it ran on. First the host's
# topology (lscpu, the GPU's CPU affinity), then ROUNDS probes unpinned and ROUNDS pinned to each
# CPU list in PIN (taskset), interleaved.
#   ROUNDS=4 PIN="0 1-7" bash scripts/dispatch_probe.sh [OUT_DIR]     (GPU host; ~3 s per probe)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/dispatch_probe}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA|CPU (max|min) MHz)"; nvidia-smi topo -m; } > "$out/topology.txt" 2>&1
cat "$out/topology.txt"
probe() {  # probe LABEL [taskset args]: one fresh process, one line per repeat
    local label=$1; shift
    "$@" python3 - "$label" <<'PY' | tee -a "$out/dispatch.txt"
import os, sys, time

import torch

from kdtree.bench.ceilings import eager_floors
from kdtree.bench.timing import time_events

x = torch.zeros(1, device="cuda")
cpus = sorted(os.sched_getaffinity(0))
for rep in range(3):
    bare = time_events([lambda: x.add_(1)], reps=500, warmup=50).median_us
    floors = eager_floors()
    on = open("/proc/self/stat").read().rsplit(")", 1)[1].split()[36]   # the CPU it last ran on
    print(f"{sys.argv[1]:>10} r{rep} {time.strftime('%H:%M:%S')} cpus {len(cpus):2d} on {on:>2}  add_ {bare:6.1f}  "
          + "  ".join(f"{k} {v:6.1f}" for k, v in floors.items()), flush=True)
PY
}
: > "$out/dispatch.txt"
for r in $(seq "${ROUNDS:-4}"); do
    probe free
    for p in ${PIN:-0}; do probe "pin$p" taskset -c "$p"; done
done
