#!/bin/bash
# One GPU call for the L2 / DRAM model check: the verify points whose L2 -> SM and DRAM bytes the
# model missed, under Nsight Compute with the SM-side L2 read bytes and L2 hit counts added.
# Usage: OUT=/tmp/x KDTREE_GIT_SHA=... bash scripts/gpu_counters_l2.sh
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_counters_l2}
mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$NCU" --query-metrics 2>&1 | grep -E "^(lrc__|l1tex__m_|lts__t_sectors_srcunit_tex|lts__t_sector_op)" > "$OUT/metrics.txt"
cat > "$OUT/points.json" <<'J'
[{"kernel": "verify_attention", "variant": "fused", "batch": 1, "q_len": 33, "heads": 64, "prefix": 4096},
 {"kernel": "verify_attention", "variant": "naive", "batch": 1, "q_len": 33, "heads": 64, "prefix": 4096},
 {"kernel": "verify_attention", "variant": "fused", "batch": 1, "q_len": 257, "heads": 64, "prefix": 4096},
 {"kernel": "verify_attention", "variant": "cascade", "batch": 1, "q_len": 257, "heads": 64, "prefix": 4096},
 {"kernel": "verify_attention", "variant": "fused", "batch": 4, "q_len": 129, "heads": 64, "prefix": 16384},
 {"kernel": "verify_attention", "variant": "fused", "batch": 1, "q_len": 9, "heads": 64, "prefix": 4096}]
J
timeout "${PROFILE_LIMIT:-120}" python3 -m kdtree.cli profile --points "$OUT/points.json" --out "$OUT/counters" 2>&1 | tail -40 | tee "$OUT/profile.log"
rm -f "$OUT/counters/counters.ncu-rep" "$OUT/counters/counters.parquet"
