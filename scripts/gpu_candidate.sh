#!/bin/bash
# A candidate kernel change in the working tree, in one GPU call: the GPU suite on it (every GPU
# test, compute-sanitizer's three tools on every fused kernel included), then the fused kernel
# against base trees (``git archive <commit> kdtree cuda`` unpacked, carried untracked) with
# scripts/attention_ab.py, the working tree last ("."). Steps that would start past BUDGET seconds
# are skipped and say so. Logs land in $OUT: suite/gpu.txt, suite/gpu_tests.log, ab.log.
#   BASES="ab_main"     the base trees
#   SHAPES="1,33,64,4096 ..."   B,N,H,P of the A/B (attention_ab.py's defaults when empty)
#   ONE_CALL=1          the A/B times one call a replay, L2 and code cold (attention_ab.py)
#   SUITE=0             skips the suite (a second call on the same commit)
#   BUDGET=560          seconds
# Usage: OUT=/tmp/cand BASES="ab_main ab_combine" bash scripts/gpu_candidate.sh
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_candidate}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT"
. scripts/device_env.sh
have() {  # have SECONDS_NEEDED NAME: is there time for this step?
  if [ $((SECONDS + $1)) -gt "$BUDGET" ]; then echo "SKIPPED $2 (budget ${BUDGET}s, at ${SECONDS}s)"; return 1; fi
}
echo "commit ${KDTREE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"
if [ "${SUITE:-1}" != 0 ]; then
  EXTRA_IMPL=none TREE_BENCH=0 bash scripts/gpu_suite.sh "$OUT/suite"
  echo "suite done at ${SECONDS}s"
fi
# shellcheck disable=SC2086
have 120 "A/B" && timeout $((BUDGET - SECONDS)) python3 scripts/attention_ab.py ${BASES:-ab_main} . -- $SHAPES \
  2>&1 | tee "$OUT/ab.log"
echo "A/B done at ${SECONDS}s (ONE_CALL=${ONE_CALL:-0})" | tee -a "$OUT/ab.log"
