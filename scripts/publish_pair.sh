#!/usr/bin/env bash
# Commit-ready folders from a twin pair that came back from the GPU host (gpu_showcase.sh's
# runs.tgz), in the checkout: unpack the two runs, drop Nsight Compute's binary report (the CSV
# exports and the parquet stay), put the GPU suite's log of the same commit in both, write the
# rerun agreement, render both reports and their comparison, point the README at the run and
# regenerate its tables. Old pairs are left alone (remove them with git rm).
#   bash scripts/publish_pair.sh RUNS_TGZ RUN_ID SUITE_LOG
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { echo "usage: bash scripts/publish_pair.sh RUNS_TGZ RUN_ID SUITE_LOG" >&2; exit 2; }
tgz=$1 rid=$2 log=$3
[ -f "$tgz" ] || { echo "RUNS_TGZ: no such file: $tgz" >&2; exit 2; }
[ -f "$log" ] || { echo "SUITE_LOG: no such file: $log" >&2; exit 2; }
a=parameterized_runs/$rid b=parameterized_runs/$rid-twin
tar xzf "$tgz"
[ -d "$a" ] && [ -d "$b" ] || { echo "RUN_ID: $tgz holds no $a and $b" >&2; exit 2; }
find "$a" "$b" -name "*.ncu-rep" -delete
cp "$log" "$a/gpu_tests.log"
cp "$log" "$b/gpu_tests.log"
python scripts/rerun_agreement.py "$a" "$b" > "$a/rerun_agreement.md"
head -5 "$a/rerun_agreement.md"
python -m kdtree.cli report "$rid" --publish --png
python -m kdtree.cli report "$rid-twin" --publish
python -m kdtree.cli compare "$rid" "$rid-twin" --publish > "$a/compare.txt"
old=$(grep -oE "reports/h200-[0-9]+-[0-9]+/index.html" README.md | head -1 | cut -d/ -f2)
[ -z "$old" ] || [ "$old" = "$rid" ] || sed -i "s/$old/$rid/g" README.md
python scripts/readme_tables.py "$a"
