#!/bin/bash
# Counters and ceilings in one GPU call: `kdtree profile` (every kernel under Nsight Compute,
# joined to the cost model) and a quick ceilings probe. The small files come back under $OUT
# (raw ncu CSV, recorded calls, joined table and metadata, ceilings, logs).
# Usage: OUT=/tmp/counters [PROFILE_ARGS="--full"] bash scripts/gpu_counters.sh
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_counters}
WORK=$(mktemp -d)
mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$NCU" --query-metrics 2>&1 | grep -E "^(sm__ops_path_tensor_src_bf16|sm__inst_executed_pipe_tensor|sm__pipe_tensor_op|lts__t_sectors_srcunit_tex_op|l1tex__m_xbar2l1tex_read|dram__bytes_)" > "$OUT/metrics.txt"
timeout "${PROFILE_LIMIT:-150}" python3 -m kdtree.cli profile --out "$WORK/counters" $PROFILE_ARGS 2>&1 | tee "$OUT/profile.log"
for f in counters_raw.csv calls.json counters.csv counters.meta.json; do cp "$WORK/counters/$f" "$OUT/" 2>/dev/null; done
timeout "${CEILINGS_LIMIT:-60}" python3 - "$OUT/ceilings.json" <<'PY' 2>&1 | tee "$OUT/ceilings.log"
import json, sys
from kdtree.bench.ceilings import measure_ceilings
from kdtree.bench.timing import clock_summary
c = measure_ceilings(quick=True)
c.save(sys.argv[1])
print(c.table().to_string(index=False))
print(json.dumps(clock_summary()))
PY
